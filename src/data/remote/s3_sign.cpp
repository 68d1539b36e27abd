// AWS Signature Version 4 (see s3_sign.h). The HMAC is OpenSSL's; the rest is string building
// that no Debian package offers apart from a whole S3 SDK (libaws-cpp-sdk is not in Debian 12).
#include "crucible/data/remote/s3_sign.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"

namespace crucible::data {
namespace {

std::string hex(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A header value as the canonical request holds it: leading and trailing spaces trimmed,
// inner runs of spaces made one.
std::string trim_value(const std::string& v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

bool valid_amz_date(const std::string& d) {
  if (d.size() != 16 || d[8] != 'T' || d[15] != 'Z') return false;
  for (size_t i = 0; i < 15; ++i) {
    if (i != 8 && !std::isdigit(static_cast<unsigned char>(d[i]))) return false;
  }
  return true;
}

}  // namespace

std::string sigv4_uri_encode(const std::string& text, bool keep_slash) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), digest, &length) == nullptr) {
    throw std::runtime_error("OpenSSL: HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

S3Signature sign_s3_request(const S3Request& r, const S3Credentials& c, const std::string& region,
                            const std::string& amz_date, const std::string& service) {
  if (!valid_amz_date(amz_date)) throw bad_input("S3 signing: date \"{}\" is not YYYYMMDDTHHMMSSZ", amz_date);
  if (c.access_key.empty() || c.secret_key.empty()) {
    throw bad_input("S3 signing: credentials need both an access key and a secret key");
  }
  const std::string payload = r.payload_sha256.empty() ? sha256_hex("") : r.payload_sha256;
  S3Signature s;
  for (const auto& [name, value] : r.headers) s.headers.emplace_back(lower(name), trim_value(value));
  s.headers.emplace_back("host", r.host);
  s.headers.emplace_back("x-amz-content-sha256", payload);
  s.headers.emplace_back("x-amz-date", amz_date);
  if (!c.session_token.empty()) s.headers.emplace_back("x-amz-security-token", c.session_token);
  std::sort(s.headers.begin(), s.headers.end());

  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [k, v] : r.query) query.emplace_back(sigv4_uri_encode(k, false), sigv4_uri_encode(v, false));
  std::sort(query.begin(), query.end());
  std::string canonical_query, canonical_headers, signed_headers;
  for (const auto& [k, v] : query) canonical_query += (canonical_query.empty() ? "" : "&") + k + "=" + v;
  for (const auto& [name, value] : s.headers) {
    canonical_headers += name + ":" + value + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  s.canonical_request = r.method + "\n" + sigv4_uri_encode(r.path.empty() ? "/" : r.path, true) + "\n" +
                        canonical_query + "\n" + canonical_headers + "\n" + signed_headers + "\n" + payload;

  const std::string day = amz_date.substr(0, 8);
  const std::string scope = day + "/" + region + "/" + service + "/aws4_request";
  s.string_to_sign = "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + sha256_hex(s.canonical_request);
  std::string key = hmac_sha256("AWS4" + c.secret_key, day);
  key = hmac_sha256(key, region);
  key = hmac_sha256(key, service);
  key = hmac_sha256(key, "aws4_request");
  s.signature = hex(hmac_sha256(key, s.string_to_sign));
  s.authorization = "AWS4-HMAC-SHA256 Credential=" + c.access_key + "/" + scope + ",SignedHeaders=" + signed_headers +
                    ",Signature=" + s.signature;
  s.headers.emplace_back("authorization", s.authorization);
  std::sort(s.headers.begin(), s.headers.end());
  return s;
}

}  // namespace crucible::data
