// Sha256 over OpenSSL's EVP interface.
#include "crucible/core/sha256.h"

#include <openssl/evp.h>

#include <stdexcept>

namespace crucible {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(new Impl) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL: cannot initialise SHA-256");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(impl_->ctx, data, size) != 1) throw std::runtime_error("OpenSSL: SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1) throw std::runtime_error("OpenSSL: SHA-256 final failed");
  return to_hex(md, len);
}

std::string to_hex(const void* data, size_t size) {
  static const char* kHex = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

}  // namespace crucible
