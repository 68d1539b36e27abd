// Objects behind HTTP(S) and S3 URLs, read with libcurl (issue 37): whole objects, byte ranges,
// and downloads of a shard by parallel range requests into a file. Connections are reused (a
// pool of curl handles, each keeping its connections alive). S3 requests ("s3://bucket/key")
// are signed (SigV4, s3_sign.h) with credentials found the AWS tools' way (s3_credentials.h),
// against data.s3_endpoint (path-style: MinIO, Ceph, moto, R2) or AWS itself (virtual-hosted).
//
// Faults, as a cluster user needs them told apart:
// - transient — 5xx, 429, timeouts (no byte for `timeout_s`), resets, truncated bodies: retried
//   with exponential backoff and full jitter; after `tries` a runtime_error (exit 1) naming the
//   URL, the last status and the tries;
// - refusals — 404, 403, 401, 400 (an unknown key, a bad signature), a server certificate that
//   the authorities in use do not vouch for, more than kMaxRedirects redirects: bad_input (exit 2)
//   at once, naming the URL and, for S3, where the credentials came from; for a certificate, what
//   to set (data.ca_bundle, AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE).
//
// HTTPS is verified against the first of data.ca_bundle, AWS_CA_BUNDLE, CURL_CA_BUNDLE and
// SSL_CERT_FILE that is set (a PEM file of authorities), else the system's. Redirects (3xx with a
// Location) are followed, at most kMaxRedirects for one request: a plain URL's by libcurl; an S3
// request's (302, 307, 308: S3's temporary redirect) are signed again for the new host and path
// (and the region of x-amz-bucket-region when given), as the old signature covers the old ones.
// S3's 301 (PermanentRedirect: the bucket is in another region) is a refusal naming
// data.s3_region.
// Thread-safe; torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible::data {

struct RemoteOptions {
  std::string s3_endpoint;  // data.s3_endpoint, "http://127.0.0.1:9000"; empty: AWS
  std::string s3_region;    // data.s3_region; empty: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
  int tries = 5;            // data.remote_tries: attempts per request, the first included
  double timeout_s = 30;    // data.remote_timeout: a request that receives nothing this long fails
  double backoff_s = 0.2;   // the first retry's longest wait; doubles each retry, capped at 10 s
  int64_t part_bytes = int64_t{8} << 20;  // range request size of a download
  int connections = 4;      // range requests in flight per download
  std::string ca_bundle;    // data.ca_bundle: the authorities HTTPS servers are verified by; empty: the variables
  // The environment (credentials, region, the CA variables for HTTPS through a private
  // authority), an argument so tests need not touch the process's.
  std::function<const char*(const char*)> env;
};

// Redirects followed for one request before it is refused as a loop.
constexpr int kMaxRedirects = 5;

// True for "s3://", "http://" and "https://" paths.
bool is_remote_path(const std::string& path);

// What a GET's headers say about an object.
struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;  // quotes removed; S3's single-part ETag is the object's MD5
  // The MD5 the ETag carries (32 hex digits, S3 single-part uploads), else empty.
  std::string md5() const;
};

struct RemoteStats {
  int64_t requests = 0;   // HTTP requests made, retries included
  int64_t retries = 0;    // requests repeated after a transient fault
  int64_t bytes = 0;      // body bytes received
  int64_t objects = 0;    // whole objects or downloads completed
};

class RemoteStore {
 public:
  explicit RemoteStore(RemoteOptions options);
  ~RemoteStore();
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  // The object's size and ETag (a HEAD request).
  ObjectInfo stat(const std::string& url) const;
  // The whole object; nullopt when it does not exist (404) and `missing_ok`.
  std::optional<std::string> read(const std::string& url, bool missing_ok = false) const;
  // Writes the whole object (`size` bytes, from stat()) into `fd` at offset 0 by range requests,
  // `connections` at a time, and returns the bytes written (`size`). A body of another length is
  // a truncation (retried).
  uint64_t download(const std::string& url, uint64_t size, int fd) const;

  RemoteStats stats() const;
  const RemoteOptions& options() const { return options_; }
  // Where S3 credentials came from ("the environment", "<file> [profile]"); empty before the
  // first S3 request.
  std::string credentials_source() const;

 private:
  struct Impl;
  RemoteOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crucible::data
