// IDX reader and writer on zlib: the header alone (inspect) or the whole array (gzip or plain).
#include "crucible/io/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
#include "crucible/core/mmap.h"

namespace crucible::io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "IDX byte swapping assumes a little-endian host");

uint32_t be32(const uint8_t* p) { return load_be32(p); }

void swap_to_native(std::vector<uint8_t>& data, size_t itemsize) {
  if (itemsize == 1) return;
  for (size_t i = 0; i + itemsize <= data.size(); i += itemsize) std::reverse(data.begin() + i, data.begin() + i + itemsize);
}

// Largest expansion deflate can achieve is about 1032:1; anything claiming more is a lie.
constexpr uint64_t kMaxDeflateRatio = 1100;

}  // namespace

DType idx_dtype(uint8_t code, const std::string& path) {
  switch (code) {
    case 0x08:
      return DType::kU8;
    case 0x09:
      return DType::kI8;
    case 0x0B:
      return DType::kI16;
    case 0x0C:
      return DType::kI32;
    case 0x0D:
      return DType::kF32;
    case 0x0E:
      return DType::kF64;
    default:
      throw bad_input("{}: byte 2: unknown IDX type code 0x{:02x} (expected 0x08 u8, 0x09 i8, 0x0b i16, "
                      "0x0c i32, 0x0d f32 or 0x0e f64)",
                      path, code);
  }
}

uint8_t idx_code(DType t) {
  switch (t) {
    case DType::kU8:
      return 0x08;
    case DType::kI8:
      return 0x09;
    case DType::kI16:
      return 0x0B;
    case DType::kI32:
      return 0x0C;
    case DType::kF32:
      return 0x0D;
    case DType::kF64:
      return 0x0E;
    default:
      throw bad_input("IDX cannot store {} (it holds u8, i8, i16, i32, f32, f64)", dtype_name(t));
  }
}

namespace {

// Inflates a gzip stream into exactly `out.size()` bytes; returns the count produced and
// whether more data followed.
size_t gunzip(const uint8_t* data, size_t size, uint8_t* out, size_t out_size, bool* more, const std::string& name) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) throw runtime_error("zlib: inflateInit2 failed");
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(std::min<size_t>(size, UINT32_MAX));
  size_t produced = 0;
  uint8_t extra[1];
  int rc = Z_OK;
  *more = false;
  for (;;) {
    const bool into_extra = produced == out_size;
    zs.next_out = into_extra ? extra : out + produced;
    const size_t room = into_extra ? 1 : std::min<size_t>(out_size - produced, UINT32_MAX);
    zs.avail_out = static_cast<uInt>(room);
    rc = inflate(&zs, Z_NO_FLUSH);
    const size_t got = room - zs.avail_out;
    if (into_extra && got > 0) {
      *more = true;
      break;
    }
    produced += into_extra ? 0 : got;
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members continue the stream (as gzip -d does).
      if (zs.avail_in > 0 && inflateReset(&zs) == Z_OK) continue;
      break;
    }
    if (rc != Z_OK || (got == 0 && zs.avail_in == 0)) break;
  }
  inflateEnd(&zs);
  // Z_BUF_ERROR means the input ended early: the caller reports the truncation.
  if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR && !*more) {
    throw bad_input("{}: corrupt gzip stream after {} uncompressed bytes: {}", name, produced,
                    zs.msg != nullptr ? zs.msg : "inflate failed");
  }
  return produced;
}

}  // namespace

bool is_gzip(const uint8_t* data, size_t size) { return size >= 2 && data[0] == 0x1f && data[1] == 0x8b; }

IdxHeader parse_idx_header(const uint8_t* data, size_t size, const std::string& path) {
  IdxHeader out;
  out.gzip = is_gzip(data, size);
  // The header: at most 4 + 4 * 255 bytes.
  uint8_t head[4 + 4 * 255];
  size_t head_n;
  bool more = false;
  if (out.gzip) {
    head_n = gunzip(data, size, head, sizeof(head), &more, path);
  } else {
    head_n = std::min(size, sizeof(head));
    std::memcpy(head, data, head_n);
  }
  if (head_n < 4) throw bad_input("{}: truncated IDX header: {} of 4 magic bytes", path, head_n);
  if (head[0] != 0 || head[1] != 0) {
    throw bad_input("{}: byte 0: not an IDX file: expected magic 00 00 <type> <ndim>, found {:02x} {:02x} {:02x} {:02x}",
                    path, head[0], head[1], head[2], head[3]);
  }
  out.dtype = idx_dtype(head[2], path);
  const int ndim = head[3];
  if (ndim == 0) throw bad_input("{}: byte 3: IDX declares 0 dimensions", path);
  out.header_bytes = 4 + 4 * static_cast<uint64_t>(ndim);
  if (head_n < out.header_bytes) {
    throw bad_input("{}: truncated IDX header: {} dimensions need {} bytes after the magic, found {}", path, ndim,
                    out.header_bytes - 4, head_n - 4);
  }
  for (int i = 0; i < ndim; ++i) out.shape.push_back(be32(&head[4 + 4 * i]));
  out.data_bytes = checked_nbytes(out.shape.data(), out.shape.size(), out.dtype, path);
  if (!out.gzip) {
    if (out.header_bytes + out.data_bytes != size) {
      throw bad_input("{}: size mismatch: the header declares {} bytes of {} data (file size {}), found {} bytes", path,
                      out.data_bytes, dtype_name(out.dtype), out.header_bytes + out.data_bytes, size);
    }
  } else if (out.data_bytes > size * kMaxDeflateRatio + (1u << 20)) {
    throw bad_input("{}: the header declares {} bytes of data, more than a {}-byte gzip file can hold", path,
                    out.data_bytes, size);
  }
  return out;
}

IdxArray parse_idx(const uint8_t* data, size_t size, const std::string& path, uint64_t memory_budget) {
  const IdxHeader h = parse_idx_header(data, size, path);
  IdxArray out;
  out.dtype = h.dtype;
  out.shape = h.shape;
  if (!h.gzip) {
    out.data.assign(data + h.header_bytes, data + size);
  } else {
    MemoryBudget budget(memory_budget);
    budget.take(h.header_bytes + h.data_bytes, size, path);
    std::vector<uint8_t> all(h.header_bytes + h.data_bytes);
    bool more = false;
    const size_t n = gunzip(data, size, all.data(), all.size(), &more, path);
    if (n < all.size()) {
      throw bad_input("{}: truncated: the header declares {} data bytes after byte {}, found {}", path, h.data_bytes,
                      h.header_bytes, n - std::min<size_t>(n, h.header_bytes));
    }
    if (more) {
      throw bad_input("{}: unexpected bytes after the {} data bytes the header declares (at uncompressed byte {})",
                      path, h.data_bytes, h.header_bytes + h.data_bytes);
    }
    // In place, so the data is held once.
    all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(h.header_bytes));
    out.data = std::move(all);
  }
  swap_to_native(out.data, dtype_size(out.dtype));
  return out;
}

IdxArray read_idx(const std::string& path, uint64_t memory_budget) {
  auto file = MappedFile::open(path);
  return parse_idx(file->data(), file->size(), path, memory_budget);
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  if (array.shape.empty() || array.shape.size() > 255) throw bad_input("IDX needs 1 to 255 dimensions");
  std::string bytes = {0, 0, static_cast<char>(idx_code(array.dtype)), static_cast<char>(array.shape.size())};
  for (int64_t d : array.shape) {
    if (d < 0 || d > 0xffffffffLL) throw bad_input("IDX dimension {} does not fit in u32", d);
    for (int s = 24; s >= 0; s -= 8) bytes += static_cast<char>((static_cast<uint64_t>(d) >> s) & 0xff);
  }
  const uint64_t nbytes = checked_nbytes(array.shape.data(), array.shape.size(), array.dtype, path);
  if (nbytes != array.data.size()) {
    throw bad_input("write_idx {}: shape needs {} bytes, data has {}", path, nbytes, array.data.size());
  }
  std::vector<uint8_t> be = array.data;
  swap_to_native(be, dtype_size(array.dtype));  // native (little) → big: the same swap
  bytes.append(reinterpret_cast<const char*>(be.data()), be.size());
  if (!gzip) {
    write_file_atomic(path, bytes);
    return;
  }
  uLongf bound = compressBound(bytes.size()) + 64;
  std::string gz(bound, '\0');
  z_stream zs{};
  if (deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw runtime_error("zlib: deflateInit2 failed");
  zs.next_in = reinterpret_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(gz.data());
  zs.avail_out = static_cast<uInt>(gz.size());
  int rc = deflate(&zs, Z_FINISH);
  gz.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) throw runtime_error("zlib: deflate failed for {}", path);
  write_file_atomic(path, gz);
}

}  // namespace crucible::io
