// AWS Signature Version 4 for S3 requests (header-based authentication), the first piece of
// reading shards from object storage (issue 37): the canonical request, the string to sign, the
// signing key by chained HMAC-SHA256 (OpenSSL) and the Authorization header, as the S3 API
// reference "Signature Calculations for the Authorization Header" lays them out. S3-compatible
// stores (MinIO, Ceph, R2, GCS's interoperable API) take the same signature. Torch-free; pure
// functions of their arguments (the time is an argument), so tests can hold them to AWS's
// published examples.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace crucible::data {

struct S3Credentials {
  std::string access_key, secret_key;
  std::string session_token;  // temporary credentials: sent as x-amz-security-token (and signed)
};

struct S3Request {
  std::string method = "GET";
  std::string host;            // "bucket.s3.amazonaws.com", or an endpoint's "host:port"
  std::string path = "/";      // the object's path, not yet encoded ("/bucket/key with space.tar")
  std::vector<std::pair<std::string, std::string>> query;    // not yet encoded
  std::vector<std::pair<std::string, std::string>> headers;  // beyond host and the x-amz-* the signer adds
  std::string payload_sha256;  // hex SHA-256 of the body; empty: of the empty body (a GET)
};

struct S3Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // 64 hex digits
  std::string authorization;  // the Authorization header's value
  // Every header to send, names lower-case, sorted: the request's, host, x-amz-content-sha256,
  // x-amz-date (and x-amz-security-token), and authorization.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Signs `request` for `region` and `service` ("s3") at `amz_date` ("20130524T000000Z", UTC).
// bad_input for a date that is not YYYYMMDDTHHMMSSZ or credentials without both keys.
S3Signature sign_s3_request(const S3Request& request, const S3Credentials& credentials, const std::string& region,
                            const std::string& amz_date, const std::string& service = "s3");

// URI-encodes `text` as SigV4 asks: every byte but A-Z a-z 0-9 - . _ ~ as %XX (upper-case hex),
// and '/' too unless `keep_slash` (object paths keep theirs).
std::string sigv4_uri_encode(const std::string& text, bool keep_slash);

// HMAC-SHA256 of `data` under `key`: the 32 raw bytes.
std::string hmac_sha256(const std::string& key, const std::string& data);

}  // namespace crucible::data
