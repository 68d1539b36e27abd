// HTTP(S) and S3 objects through libcurl (remote.h): a pool of easy handles (each keeps its
// connections alive between requests), one retry policy for every request, S3 signing.
#include "crucible/data/remote/remote.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/remote/s3_credentials.h"
#include "crucible/data/remote/s3_sign.h"

namespace crucible::data {
namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// One request's target: what curl fetches, and what SigV4 signs (S3 only).
struct Target {
  std::string url;   // what curl fetches
  bool s3 = false;
  std::string host;  // S3: the Host header signed
  std::string path;  // S3: the path signed, not yet encoded
  std::string region;  // S3: the region signed for
};

// libcurl's URL parser (CURLU), released with the object.
struct CurlUrl {
  CURLU* h = curl_url();
  CurlUrl() = default;
  CurlUrl(const CurlUrl&) = delete;
  CurlUrl& operator=(const CurlUrl&) = delete;
  ~CurlUrl() { curl_url_cleanup(h); }
  // A part of the URL ("" when it has none); `flags` as curl_url_get's (CURLU_URLDECODE).
  std::string get(CURLUPart part, unsigned flags = 0) const {
    char* v = nullptr;
    if (curl_url_get(h, part, &v, flags) != CURLUE_OK || v == nullptr) return "";
    std::string out(v);
    curl_free(v);
    return out;
  }
};

// The XML <Code> / <Message> of an S3 error body, or the body's start.
std::string error_detail(const std::string& body) {
  auto tag = [&](const char* name) {
    const std::string open = std::string("<") + name + ">", close = std::string("</") + name + ">";
    const size_t a = body.find(open);
    if (a == std::string::npos) return std::string();
    const size_t b = body.find(close, a);
    return b == std::string::npos ? std::string() : body.substr(a + open.size(), b - a - open.size());
  };
  const std::string code = tag("Code"), message = tag("Message");
  if (!code.empty()) return message.empty() ? code : code + ": " + message;
  std::string head = trim(body.substr(0, 120));
  for (char& c : head) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return head;
}

// What one try gave.
struct Attempt {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;
  uint64_t content_length = 0;
  bool has_content_length = false;
  std::string etag;
  uint64_t range_total = 0;  // "Content-Range: bytes a-b/total"
  bool has_range_total = false;
  std::string location;       // a redirect's target
  std::string bucket_region;  // S3's x-amz-bucket-region
  std::string effective_url;  // where the last response came from (after redirects)
  long header_status = 0;    // from the status line, while the body arrives
  // A download's part: a 2xx body goes straight into the file at sink_offset (no copy in memory).
  int sink_fd = -1;
  uint64_t sink_offset = 0, sink_limit = 0;
  uint64_t received = 0;     // body bytes, wherever they went
  int sink_errno = 0;
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const size_t len = size * n;
  if (a->sink_fd >= 0 && a->header_status / 100 == 2) {
    if (a->received + len > a->sink_limit) return 0;  // more than the range: not written past it (curl fails)
    for (size_t done = 0; done < len;) {
      const ssize_t w = ::pwrite(a->sink_fd, data + done, len - done, static_cast<off_t>(a->sink_offset + a->received + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        a->sink_errno = errno;
        return 0;  // curl stops with CURLE_WRITE_ERROR
      }
      done += static_cast<size_t>(w);
    }
  } else {
    a->body.append(data, len);
  }
  a->received += len;
  return len;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const std::string line(data, size * n);
  if (starts_with(line, "HTTP/")) {  // a new response (after a 100 Continue, a redirect): forget the last
    a->has_content_length = a->has_range_total = false;
    a->etag.clear();
    a->location.clear();
    a->bucket_region.clear();
    if (a->header_status / 100 != 2) {  // what a redirect's body brought is not this response's
      a->body.clear();
      a->received = 0;
    }
    const size_t sp = line.find(' ');
    a->header_status = sp == std::string::npos ? 0 : std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  const std::string name = lower(trim(line.substr(0, colon))), value = trim(line.substr(colon + 1));
  if (name == "content-length") {
    a->content_length = std::strtoull(value.c_str(), nullptr, 10);
    a->has_content_length = true;
  } else if (name == "etag") {
    a->etag = value;
    a->etag.erase(std::remove(a->etag.begin(), a->etag.end(), '"'), a->etag.end());
  } else if (name == "location") {
    a->location = value;
  } else if (name == "x-amz-bucket-region") {
    a->bucket_region = value;
  } else if (name == "content-range") {
    const size_t slash = value.rfind('/');
    if (slash != std::string::npos && value.substr(slash + 1) != "*") {
      a->range_total = std::strtoull(value.c_str() + slash + 1, nullptr, 10);
      a->has_range_total = true;
    }
  }
  return size * n;
}

std::string amz_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

double jitter01() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

bool is_remote_path(const std::string& path) {
  return starts_with(path, "s3://") || starts_with(path, "http://") || starts_with(path, "https://");
}

std::string ObjectInfo::md5() const {
  if (etag.size() != 32) return "";
  for (char c : etag) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
  }
  return lower(etag);
}

struct RemoteStore::Impl {
  const RemoteOptions& options;
  std::mutex mu;
  std::vector<CURL*> idle;  // guarded by mu
  bool have_credentials = false;  // guarded by mu
  FoundS3Credentials credentials;  // guarded by mu
  std::string region;
  std::string ca_bundle;  // the authorities HTTPS is verified by (empty: the system's)
  std::string ca_source;  // where they came from, for messages: "data.ca_bundle = /x.pem"
  std::atomic<int64_t> requests{0}, retries{0}, bytes{0}, objects{0};

  explicit Impl(const RemoteOptions& o) : options(o) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    region = o.s3_region;
    const char* names[] = {"AWS_REGION", "AWS_DEFAULT_REGION"};
    for (const char* n : names) {
      if (!region.empty()) break;
      const char* v = o.env ? o.env(n) : nullptr;
      if (v != nullptr) region = v;
    }
    if (region.empty()) region = "us-east-1";
    // A private authority: the setting, else the AWS tools', curl's and OpenSSL's variables.
    if (!o.ca_bundle.empty()) {
      ca_bundle = o.ca_bundle;
      ca_source = "data.ca_bundle = " + ca_bundle;
    }
    for (const char* n : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
      if (!ca_bundle.empty()) break;
      const char* v = o.env ? o.env(n) : nullptr;
      if (v != nullptr && *v != 0) {
        ca_bundle = v;
        ca_source = std::string(n) + " = " + ca_bundle;
      }
    }
    if (ca_bundle.empty()) ca_source = "the system's authorities (none of data.ca_bundle, AWS_CA_BUNDLE, CURL_CA_BUNDLE, "
                                       "SSL_CERT_FILE is set)";
  }
  ~Impl() {
    for (CURL* h : idle) curl_easy_cleanup(h);
  }

  CURL* acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        CURL* h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (h == nullptr) throw runtime_error("libcurl could not make a handle");
    return h;
  }
  void release(CURL* h) {
    curl_easy_reset(h);  // keeps the handle's live connections
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(h);
  }

  FoundS3Credentials creds() {
    std::lock_guard<std::mutex> lock(mu);
    if (!have_credentials) {
      credentials = find_s3_credentials(options.env ? options.env : [](const char*) -> const char* { return nullptr; });
      have_credentials = true;
    }
    return credentials;
  }

  Target target(const std::string& url) const {
    Target t;
    if (!starts_with(url, "s3://")) {
      t.url = url;
      return t;
    }
    t.s3 = true;
    t.region = region;
    const std::string rest = url.substr(5);
    const size_t slash = rest.find('/');
    const std::string bucket = rest.substr(0, slash);
    const std::string key = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (bucket.empty()) throw bad_input("{}: expected s3://bucket/key", url);
    std::string endpoint = options.s3_endpoint;
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    if (endpoint.empty()) {  // AWS, virtual-hosted style
      t.host = bucket + ".s3." + region + ".amazonaws.com";
      t.path = "/" + key;
      t.url = "https://" + t.host + sigv4_uri_encode(t.path, true);
      return t;
    }
    const size_t scheme = endpoint.find("://");
    if (scheme == std::string::npos) {
      throw bad_input("data.s3_endpoint {}: expected http://host[:port] or https://host[:port]", endpoint);
    }
    const size_t host_end = endpoint.find('/', scheme + 3);
    t.host = endpoint.substr(scheme + 3, host_end == std::string::npos ? std::string::npos : host_end - scheme - 3);
    const std::string base = host_end == std::string::npos ? "" : endpoint.substr(host_end);
    t.path = base + "/" + bucket + "/" + key;  // path style: MinIO, Ceph, moto
    t.url = endpoint.substr(0, host_end) + sigv4_uri_encode(t.path, true);
    return t;
  }

  // Where an S3 redirect (302, 307, 308) of `from` sends the request: the Location's host and
  // path, to be signed again (the old signature covers the old ones), in the region S3 names.
  static Target redirected(const std::string& url, const Target& from, const Attempt& a) {
    if (a.location.empty()) throw bad_input("{}: HTTP {} without a Location to follow", url, a.status);
    CurlUrl u;  // the Location, resolved against the URL it answered when relative
    if (curl_url_set(u.h, CURLUPART_URL, from.url.c_str(), 0) != CURLUE_OK ||
        curl_url_set(u.h, CURLUPART_URL, a.location.c_str(), 0) != CURLUE_OK) {
      throw bad_input("{}: HTTP {} to {}: not a URL to follow", url, a.status, a.location);
    }
    const std::string scheme = u.get(CURLUPART_SCHEME);
    if (scheme != "http" && scheme != "https") {
      throw bad_input("{}: HTTP {} to {}: expected an http(s) URL to follow", url, a.status, a.location);
    }
    if (!u.get(CURLUPART_QUERY).empty()) {
      throw bad_input("{}: HTTP {} to {}: a redirect with a query is not signed again; point data.s3_endpoint at "
                      "where the objects are",
                      url, a.status, a.location);
    }
    Target t = from;
    const std::string port = u.get(CURLUPART_PORT);
    t.host = u.get(CURLUPART_HOST) + (port.empty() ? "" : ":" + port);
    t.path = u.get(CURLUPART_PATH, CURLU_URLDECODE);
    if (t.path.empty()) t.path = "/";
    t.url = scheme + "://" + t.host + sigv4_uri_encode(t.path, true);
    if (!a.bucket_region.empty()) t.region = a.bucket_region;
    return t;
  }

  // One try of `method` on `t` (a range when size > 0).
  Attempt perform(const Target& t, const char* method, uint64_t offset, uint64_t size, int sink_fd) {
    Attempt a;
    a.sink_fd = sink_fd;
    a.sink_offset = offset;
    a.sink_limit = size;
    std::vector<std::pair<std::string, std::string>> headers;
    if (size > 0) headers.emplace_back("range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + size - 1));
    if (t.s3) {
      S3Request r;
      r.method = method;
      r.host = t.host;
      r.path = t.path;
      r.headers = headers;
      headers = sign_s3_request(r, creds().credentials, t.region, amz_date_now()).headers;
      headers.erase(std::remove_if(headers.begin(), headers.end(), [](const auto& h) { return h.first == "host"; }),
                    headers.end());  // curl sends the same Host itself
    }
    curl_slist* list = nullptr;
    for (const auto& h : headers) list = curl_slist_append(list, (h.first + ": " + h.second).c_str());
    char error[CURL_ERROR_SIZE] = {0};
    CURL* h = acquire();
    curl_easy_setopt(h, CURLOPT_URL, t.url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
    if (std::string(method) == "HEAD") curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &a);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // many threads: no SIGALRM for timeouts
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // nothing received for timeout_s: a timeout
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, std::lround(options.timeout_s)));
    curl_easy_setopt(h, CURLOPT_USERAGENT, "crucible/" CRUCIBLE_VERSION);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);  // fewer, larger writes
    if (!ca_bundle.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, ca_bundle.c_str());
    if (!t.s3) {  // a plain URL may move (http → https, a mirror); an S3 one is signed again (request())
      curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
      curl_easy_setopt(h, CURLOPT_MAXREDIRS, static_cast<long>(kMaxRedirects));
      curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    }
    a.code = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.status);
    const char* effective = nullptr;
    if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective != nullptr) {
      a.effective_url = effective;
    }
    if (a.code != CURLE_OK) a.curl_error = error[0] != 0 ? error : curl_easy_strerror(a.code);
    release(h);
    curl_slist_free_all(list);
    requests.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(static_cast<int64_t>(a.received), std::memory_order_relaxed);
    return a;
  }

  // Runs `method` with the retry policy; `expect` is the body length a success must have
  // (range reads), 0 for any. Returns the successful attempt; nullopt for 404 when `missing_ok`.
  // With `sink_fd`, a successful body is written into that file at `offset` instead.
  std::optional<Attempt> request(const std::string& url, const char* method, uint64_t offset, uint64_t size,
                                 bool missing_ok, int sink_fd = -1) {
    Target t = target(url);
    std::string last;
    const int tries = std::max(1, options.tries);
    int redirects = 0;
    for (int attempt = 1;; ++attempt) {
      Attempt a = perform(t, method, offset, size, sink_fd);
      if (a.sink_errno != 0) throw runtime_error("cannot write the download of {}: {}", url, errno_text(a.sink_errno));
      if (a.code == CURLE_PEER_FAILED_VERIFICATION) {
        throw bad_input("{}: the server's certificate is not trusted ({}); verified against {}. Name the authority "
                        "that signed it (a PEM file) in data.ca_bundle, or in AWS_CA_BUNDLE, CURL_CA_BUNDLE or "
                        "SSL_CERT_FILE",
                        url, a.curl_error, ca_source);
      }
      if (a.code == CURLE_SSL_CACERT_BADFILE) {
        throw bad_input("{}: cannot read the certificate authorities of {} ({}): expected a PEM file", url, ca_source,
                        a.curl_error);
      }
      if (a.code == CURLE_TOO_MANY_REDIRECTS) {
        throw bad_input("{}: more than {} redirects (the last to {}): a redirect loop", url, kMaxRedirects,
                        a.effective_url);
      }
      if (a.code == CURLE_OK && t.s3 && (a.status == 302 || a.status == 307 || a.status == 308)) {
        if (++redirects > kMaxRedirects) {
          throw bad_input("{}: more than {} redirects (the last to {}): a redirect loop", url, kMaxRedirects,
                          a.location);
        }
        t = redirected(url, t, a);
        --attempt;  // a redirect is not a try
        continue;
      }
      const bool head = std::string(method) == "HEAD";
      if (a.code == CURLE_WRITE_ERROR && sink_fd >= 0 && a.status == 200 && offset == 0) {
        throw runtime_error("{}: the server answers a range request with the whole object (it ignores Range)", url);
      }
      if (a.code == CURLE_OK && (a.status == 200 || a.status == 206)) {
        const uint64_t got = a.received;
        if (sink_fd < 0 && size > 0 && a.status == 200 && got > size) {  // Range ignored: the whole object came
          a.body = a.body.substr(offset < got ? offset : got, size);
          if (a.body.size() == size) return a;
          last = fmt::format("a body of {} bytes without bytes {}-{}", got, offset, offset + size - 1);
        } else if (size > 0 && got != size) {
          last = fmt::format("a truncated body ({} of {} bytes)", got, size);
        } else if (!head && a.has_content_length && got != a.content_length) {
          last = fmt::format("a truncated body ({} of {} bytes)", got, a.content_length);
        } else {
          return a;
        }
      } else if (a.code == CURLE_OK && (a.status == 404 || a.status == 403 || a.status == 401 || a.status == 400 ||
                                        a.status == 301 || a.status == 416)) {
        if (a.status == 404 && missing_ok) return std::nullopt;
        refuse(url, t, a);
      } else if (a.code == CURLE_OK) {
        last = fmt::format("HTTP {}{}", a.status, a.body.empty() ? "" : " (" + error_detail(a.body) + ")");
      } else {
        last = a.curl_error;
      }
      if (a.code == CURLE_OK && a.status != 0 && a.status < 500 && a.status != 429 && a.status != 200 &&
          a.status != 206) {
        throw runtime_error("{}: unexpected HTTP {} ({})", url, a.status, error_detail(a.body));
      }
      if (attempt >= tries) {
        throw runtime_error("{}: gave up after {} tr{}; the last: {}", url, tries, tries == 1 ? "y" : "ies", last);
      }
      const int64_t total = retries.fetch_add(1, std::memory_order_relaxed) + 1;
      // Full jitter (AWS's "Exponential Backoff And Jitter"): uniform in [0, min(cap, base × 2^k)].
      const double cap = std::min(10.0, options.backoff_s * std::pow(2.0, attempt - 1));
      if (total <= 10 || total % 100 == 0) {  // the first few, then a count now and then
        log_warn("{}: {}; try {} of {} within {:.2f} s ({} retr{} so far)", url, last, attempt + 1, tries, cap, total,
                 total == 1 ? "y" : "ies");
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(cap * jitter01()));
    }
  }

  [[noreturn]] void refuse(const std::string& url, const Target& t, const Attempt& a) {
    std::string why;
    switch (a.status) {
      case 404: why = "the object does not exist"; break;
      case 403: why = "access denied"; break;
      case 401: why = "not authorised"; break;
      case 301:
        why = "the bucket is in another region than " + t.region + " (data.s3_region)" +
              (a.bucket_region.empty() ? "" : "; S3 says " + a.bucket_region);
        break;
      case 416: why = "the range is outside the object"; break;
      default: why = "the request was refused"; break;
    }
    const std::string detail = error_detail(a.body);
    std::string creds;
    if (t.s3) {
      std::lock_guard<std::mutex> lock(mu);
      creds = fmt::format("; credentials from {}, region {}, endpoint {}", credentials.source, t.region,
                          options.s3_endpoint.empty() ? "AWS" : options.s3_endpoint);
    }
    throw bad_input("{}: HTTP {}: {}{}{}", url, a.status, why, detail.empty() ? "" : " (" + detail + ")", creds);
  }
};

RemoteStore::RemoteStore(RemoteOptions options) : options_(std::move(options)) {
  if (options_.tries < 1) throw bad_input("data.remote_tries should be at least 1, found {}", options_.tries);
  if (!(options_.timeout_s > 0)) throw bad_input("data.remote_timeout should be positive, found {}", options_.timeout_s);
  if (options_.connections < 1) options_.connections = 1;
  if (options_.part_bytes < 1) options_.part_bytes = int64_t{8} << 20;
  impl_ = std::make_unique<Impl>(options_);
}

RemoteStore::~RemoteStore() = default;

ObjectInfo RemoteStore::stat(const std::string& url) const {
  // A GET of the first byte, not a HEAD: an error then comes with its body (S3's <Code>, such as
  // SignatureDoesNotMatch), and Content-Range gives the size.
  const auto a = impl_->request(url, "GET", 0, 1, false);
  if (a->status == 206 && a->has_range_total) return {a->range_total, a->etag};
  if (a->status == 200 && a->has_content_length) return {a->content_length, a->etag};  // a one-byte object
  throw runtime_error("{}: the server gave no size (HTTP {} without Content-Range)", url, a->status);
}

std::optional<std::string> RemoteStore::read(const std::string& url, bool missing_ok) const {
  auto a = impl_->request(url, "GET", 0, 0, missing_ok);
  if (!a) return std::nullopt;
  impl_->objects.fetch_add(1, std::memory_order_relaxed);
  return std::move(a->body);
}

uint64_t RemoteStore::download(const std::string& url, uint64_t size, int fd) const {
  const uint64_t part = static_cast<uint64_t>(options_.part_bytes);
  const uint64_t parts = (size + part - 1) / part;
  std::atomic<uint64_t> next{0}, written{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (error) return;
      }
      const uint64_t i = next.fetch_add(1);
      if (i >= parts) return;
      const uint64_t offset = i * part, n = std::min(part, size - offset);
      try {
        written += impl_->request(url, "GET", offset, n, false, fd)->received;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        return;
      }
    }
  };
  const int threads = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(options_.connections), parts));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  impl_->objects.fetch_add(1, std::memory_order_relaxed);
  return written.load();
}

RemoteStats RemoteStore::stats() const {
  RemoteStats s;
  s.requests = impl_->requests.load();
  s.retries = impl_->retries.load();
  s.bytes = impl_->bytes.load();
  s.objects = impl_->objects.load();
  return s;
}

std::string RemoteStore::credentials_source() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->have_credentials ? impl_->credentials.source : "";
}

}  // namespace crucible::data
