// IDX reader and writer on zlib (gzread reads gzip and plain files alike).
#include "crucible/io/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "IDX byte swapping assumes a little-endian host");

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `size` bytes; returns the count (short only at end of file).
size_t gz_read(gzFile f, void* dst, size_t size, const std::string& path) {
  size_t got = 0;
  char* p = static_cast<char*>(dst);
  while (got < size) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - got, 1u << 30));
    int n = gzread(f, p + got, chunk);
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      throw bad_input("{}: corrupt gzip stream near uncompressed byte {}: {}", path, got, msg);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

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

IdxArray read_idx(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw bad_input("cannot open IDX file {}: {}", path, errno_text(errno));
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) throw bad_input("cannot open IDX file {}: {}", path, errno_text(errno));
  gzbuffer(f.get(), 1 << 17);
  const bool compressed = gzdirect(f.get()) == 0;

  uint8_t magic[4];
  size_t n = gz_read(f.get(), magic, 4, path);
  if (n < 4) throw bad_input("{}: truncated IDX header: {} of 4 magic bytes", path, n);
  if (magic[0] != 0 || magic[1] != 0) {
    throw bad_input("{}: byte 0: not an IDX file: expected magic 00 00 <type> <ndim>, found {:02x} {:02x} {:02x} {:02x}",
                    path, magic[0], magic[1], magic[2], magic[3]);
  }
  IdxArray out;
  out.dtype = idx_dtype(magic[2], path);
  const int ndim = magic[3];
  if (ndim == 0) throw bad_input("{}: byte 3: IDX declares 0 dimensions", path);
  std::vector<uint8_t> dims_raw(4 * static_cast<size_t>(ndim));
  n = gz_read(f.get(), dims_raw.data(), dims_raw.size(), path);
  if (n < dims_raw.size()) {
    throw bad_input("{}: truncated IDX header: {} dimensions need {} bytes after the magic, found {}", path, ndim,
                    dims_raw.size(), n);
  }
  for (int i = 0; i < ndim; ++i) out.shape.push_back(be32(&dims_raw[4 * i]));
  const uint64_t header = 4 + dims_raw.size();
  const uint64_t nbytes = checked_nbytes(out.shape.data(), out.shape.size(), out.dtype, path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (!compressed && header + nbytes != file_size) {
    throw bad_input("{}: size mismatch: the header declares {} bytes of {} data (file size {}), found {} bytes", path,
                    nbytes, dtype_name(out.dtype), header + nbytes, file_size);
  }
  if (compressed && nbytes > file_size * kMaxDeflateRatio + (1u << 20)) {
    throw bad_input("{}: the header declares {} bytes of data, more than a {}-byte gzip file can hold", path, nbytes,
                    file_size);
  }
  out.data.resize(nbytes);
  n = gz_read(f.get(), out.data.data(), nbytes, path);
  if (n < nbytes) {
    throw bad_input("{}: truncated: the header declares {} data bytes after byte {}, found {}", path, nbytes, header, n);
  }
  uint8_t extra;
  if (gz_read(f.get(), &extra, 1, path) != 0) {
    throw bad_input("{}: unexpected bytes after the {} data bytes the header declares (at uncompressed byte {})", path,
                    nbytes, header + nbytes);
  }
  swap_to_native(out.data, dtype_size(out.dtype));
  return out;
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
