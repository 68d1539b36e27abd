// Archives that inflate (see zeros_archive.h).
#include "zeros_archive.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include "crucible/io/array.h"
#include "crucible/io/npy.h"
#include "test_util.h"

namespace crucible::test {
namespace {
constexpr uint64_t kMiB = uint64_t{1} << 20;
}  // namespace

// `head` then `zeros` zero bytes as one raw deflate stream. After a full flush deflate's
// output depends only on its input, so one compressed MiB of zeros is repeated: a GiB costs a
// KiB of work and no GiB of memory.
Deflated deflate_zeros(const std::string& head, uint64_t zeros) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  auto run = [&](const uint8_t* in, size_t n, int flush) {
    std::string out;
    std::vector<uint8_t> buf(1 << 16);
    zs.next_in = const_cast<Bytef*>(in);
    zs.avail_in = static_cast<uInt>(n);
    do {
      zs.next_out = buf.data();
      zs.avail_out = static_cast<uInt>(buf.size());
      deflate(&zs, flush);
      out.append(reinterpret_cast<const char*>(buf.data()), buf.size() - zs.avail_out);
    } while (zs.avail_out == 0 || zs.avail_in > 0);
    return out;
  };
  const std::vector<uint8_t> mib(kMiB, 0);
  Deflated d;
  d.bytes = run(reinterpret_cast<const uint8_t*>(head.data()), head.size(), Z_FULL_FLUSH);
  d.crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(head.data()), static_cast<uInt>(head.size())));
  const uLong mib_crc = crc32(0, mib.data(), static_cast<uInt>(kMiB));
  const uint64_t blocks = zeros / kMiB, rest = zeros % kMiB;
  std::string block;
  for (uint64_t i = 0; i < blocks; ++i) {
    if (i < 2) {
      const std::string b = run(mib.data(), kMiB, Z_FULL_FLUSH);
      if (i == 1) {
        EXPECT_EQ(b, block) << "deflate output after a full flush should repeat";
      }
      block = b;
    }
    d.bytes += block;
    d.crc = static_cast<uint32_t>(crc32_combine(d.crc, mib_crc, static_cast<z_off_t>(kMiB)));
  }
  d.bytes += run(mib.data(), rest, Z_FINISH);
  d.crc = static_cast<uint32_t>(
      crc32_combine(d.crc, crc32(0, mib.data(), static_cast<uInt>(rest)), static_cast<z_off_t>(rest)));
  deflateEnd(&zs);
  d.size = head.size() + zeros;
  return d;
}

void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

// A zip archive (no zip64: members under 4 GiB) of deflated members.
void write_zip(const std::string& path, const std::vector<ZipEntry>& entries) {
  std::string out, dir;
  for (const auto& e : entries) {
    const uint64_t usize = e.declared_size != 0 ? e.declared_size : e.data.size;
    const uint64_t offset = out.size();
    auto common = [&](std::string& s) {
      put(s, 20, 2);    // version needed
      put(s, 0, 2);     // flags
      put(s, 8, 2);     // deflate
      put(s, 0, 2);     // time
      put(s, 0x21, 2);  // date: 1980-01-01
      put(s, e.data.crc, 4);
      put(s, e.data.bytes.size(), 4);
      put(s, usize, 4);
      put(s, e.name.size(), 2);
      put(s, 0, 2);  // extra
    };
    put(out, 0x04034b50, 4);
    common(out);
    out += e.name;
    out += e.data.bytes;
    put(dir, 0x02014b50, 4);
    put(dir, 20, 2);  // made by
    common(dir);
    put(dir, 0, 2);  // comment
    put(dir, 0, 2);  // disk
    put(dir, 0, 2);  // internal attributes
    put(dir, 0, 4);  // external attributes
    put(dir, offset, 4);
    dir += e.name;
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  put(out, 0x06054b50, 4);
  put(out, 0, 4);
  put(out, entries.size(), 2);
  put(out, entries.size(), 2);
  put(out, dir.size(), 4);
  put(out, dir_offset, 4);
  put(out, 0, 2);
  test::write_text(path, out);
}

// The .npy header crucible and NumPy write for a C-order little-endian array.
std::string header_for(io::DType t, std::vector<int64_t> shape) {
  io::Array a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.strides = io::Array::c_strides(a.shape);
  return io::npy_header(a, "test");
}

// An .npz of one deflated member "<name>.npy": an npy header for [n] elements of `t`, then zeros.
void zeros_npz(const std::string& path, const std::string& name, io::DType t, uint64_t n) {
  write_zip(path, {{name + ".npy", deflate_zeros(header_for(t, {static_cast<int64_t>(n)}), n * io::dtype_size(t))}});
}

// A gzip IDX file: u8 [d0, d1, d2] of zeros.
void zeros_gzip_idx(const std::string& path, uint32_t d0, uint32_t d1, uint32_t d2) {
  std::string head = {0, 0, 0x08, 3};
  for (uint32_t d : {d0, d1, d2}) {
    for (int s = 24; s >= 0; s -= 8) head += static_cast<char>((d >> s) & 0xff);
  }
  const Deflated z = deflate_zeros(head, uint64_t{d0} * d1 * d2);
  std::string gz = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, 3};
  gz += z.bytes;
  put(gz, z.crc, 4);
  put(gz, z.size & 0xffffffff, 4);
  test::write_text(path, gz);
}

}  // namespace crucible::test
