// SHA-256 (OpenSSL's libcrypto) for checkpoint checksums and parameter digests.
// Not thread-safe: one object per thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace crucible {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // Lower-case hex digest (64 characters). The object is then spent.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(std::string_view data);

// `size` bytes as lower-case hex (2·size characters): digests and the hashes sidecars record.
std::string to_hex(const void* data, size_t size);

}  // namespace crucible
