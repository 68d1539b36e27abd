// A zip archive in memory, read-only (libzip): the members of torch.save's .pt files (pt.cpp)
// and of torch.export's .pt2 archives (pt2.cpp). Hardened for untrusted files: sizes checked
// against the bytes, deflate ratios capped, CRCs checked; stored members are viewed in place.
// Private to io.
#pragma once

#include <zip.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::io {

constexpr uint64_t kMaxDeflateRatio = 1100;  // deflate expands at most about 1032:1

// A string from a file made safe for one line of a message: control and non-ASCII bytes as
// \xNN, cut at `cap` bytes.
std::string shown(const std::string& s, size_t cap = 100);

// A libzip source over caller-owned bytes that remembers where reads start: libzip has no
// public call for a member's data offset, so a stored member is found by where libzip reads
// its first bytes, then checked against them, and viewed instead of copied.
struct MemSource {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t pos = 0;
  zip_error_t error;
  bool recording = false;
  uint64_t first_read = std::numeric_limits<uint64_t>::max();
};

// libzip's source callback over a MemSource.
zip_int64_t mem_source_callback(void* user, void* data, zip_uint64_t len, zip_source_cmd_t cmd);

// Bytes of one member: a view into the input, or a copy that `owner` holds.
struct MemberBytes {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<const void> owner;  // null for a view (the input's owner holds it)
};

// A zip archive in memory, read-only. Not copyable: libzip holds a pointer to source_.
class ZipArchive {
 public:
  // Returns false (and sets *why to libzip's reason) when the bytes are not a readable zip.
  bool open(const uint8_t* data, size_t size, const std::string& name, std::string* why) {
    name_ = name;
    source_.data = data;
    source_.size = size;
    zip_error_init(&source_.error);
    error_ready_ = true;
    zip_error_t err;
    zip_error_init(&err);
    zip_source_t* src = zip_source_function_create(mem_source_callback, &source_, &err);
    if (src == nullptr) {
      *why = zip_error_strerror(&err);
      zip_error_fini(&err);
      return false;
    }
    za_ = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (za_ == nullptr) {
      *why = zip_error_strerror(&err);
      zip_error_fini(&err);
      zip_source_free(src);
      return false;
    }
    zip_error_fini(&err);
    const zip_int64_t n = zip_get_num_entries(za_, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const char* member = zip_get_name(za_, static_cast<zip_uint64_t>(i), 0);
      names_.emplace_back(member != nullptr ? member : "");
      index_.emplace(names_.back(), static_cast<zip_uint64_t>(i));  // the first of equal names wins
    }
    return true;
  }

  ~ZipArchive() {
    if (za_ != nullptr) zip_discard(za_);
    if (error_ready_) zip_error_fini(&source_.error);
  }
  ZipArchive() = default;
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::vector<std::string>& names() const { return names_; }

  // Index of `member`, or -1.
  int64_t find(const std::string& member) const {
    auto it = index_.find(member);
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  }

  // The whole member, copied (and CRC-checked by libzip). The buffer grows with the bytes that
  // arrive, so a size field that lies costs no allocation.
  std::vector<uint8_t> read(zip_uint64_t index) {
    const zip_stat_t st = stat(index);
    zip_file_t* f = zip_fopen_index(za_, index, 0);
    if (f == nullptr) fail_zip(index, zip_strerror(za_));
    std::vector<uint8_t> out;
    uint64_t got = 0;
    while (true) {
      uint8_t extra;
      uint8_t* dst = &extra;
      uint64_t want = 1;  // past the declared size: expect the end (where libzip checks the CRC)
      if (got < st.size) {
        if (got == out.size()) out.resize(got + std::min<uint64_t>(st.size - got, std::max<uint64_t>(got, 1 << 20)));
        dst = out.data() + got;
        want = out.size() - got;
      }
      const zip_int64_t r = zip_fread(f, dst, want);
      if (r < 0) {
        const std::string why = zip_error_strerror(zip_file_get_error(f));
        zip_fclose(f);
        fail_zip(index, why);
      }
      if (r == 0) break;
      if (got >= st.size) {
        zip_fclose(f);
        fail_zip(index, fmt::format("holds more than the {} bytes its directory entry declares", st.size));
      }
      got += static_cast<uint64_t>(r);
    }
    zip_fclose(f);
    if (got != st.size) {
      fail_zip(index, fmt::format("holds {} bytes but its directory entry declares {} (truncated?)", got, st.size));
    }
    return out;
  }

  // The member's bytes: a view into the input when stored uncompressed, else a copy.
  MemberBytes bytes(zip_uint64_t index) {
    const zip_stat_t st = stat(index);
    MemberBytes b;
    b.size = st.size;
    if (st.comp_method == ZIP_CM_STORE && st.encryption_method == ZIP_EM_NONE) {
      if (st.size == 0) {
        static const uint8_t kNothing = 0;
        b.data = &kNothing;
        return b;
      }
      zip_file_t* f = zip_fopen_index(za_, index, 0);
      if (f == nullptr) fail_zip(index, zip_strerror(za_));
      uint8_t probe[16];
      const uint64_t n = std::min<uint64_t>(sizeof probe, st.size);
      source_.first_read = std::numeric_limits<uint64_t>::max();
      source_.recording = true;
      const zip_int64_t got = zip_fread(f, probe, n);
      source_.recording = false;
      zip_fclose(f);
      const uint64_t at = source_.first_read;
      if (got == static_cast<zip_int64_t>(n) && at <= source_.size && st.size <= source_.size - at &&
          std::memcmp(probe, source_.data + at, n) == 0) {
        b.data = source_.data + at;
        return b;
      }
    }
    auto copy = std::make_shared<std::vector<uint8_t>>(read(index));
    b.data = copy->data();
    b.owner = copy;
    return b;
  }

 private:
  zip_stat_t stat(zip_uint64_t index) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(za_, index, 0, &st) != 0) fail_zip(index, zip_strerror(za_));
    const zip_uint64_t need = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
    if ((st.valid & need) != need) fail_zip(index, "its directory entry lacks sizes or a compression method");
    if (!(st.valid & ZIP_STAT_ENCRYPTION_METHOD)) st.encryption_method = ZIP_EM_NONE;
    if (st.comp_method == ZIP_CM_STORE && st.size > source_.size) {
      fail_zip(index, fmt::format("declares {} bytes, more than the {}-byte file holds", st.size, source_.size));
    }
    if (st.comp_method != ZIP_CM_STORE && st.size / kMaxDeflateRatio > st.comp_size) {
      fail_zip(index, fmt::format("claims {} bytes from {} compressed bytes, more than compression can yield", st.size,
                                  st.comp_size));
    }
    return st;
  }

  [[noreturn]] void fail_zip(zip_uint64_t index, const std::string& why) const {
    throw bad_input("{}: zip member '{}': {}", name_, shown(names_.at(index)), why);
  }

  std::string name_;
  MemSource source_;
  bool error_ready_ = false;
  zip_t* za_ = nullptr;
  std::vector<std::string> names_;
  std::unordered_map<std::string, zip_uint64_t> index_;
};

}  // namespace crucible::io
