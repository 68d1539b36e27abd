// npz (stored and deflated), raw .bin and text against NumPy as the oracle, both directions,
// plus the bad inputs of each: a zip bomb, a raw size that does not fit the declared dtype and
// shape (D12), a text token that is not a number.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"
#include "crucible/io/npz.h"
#include "crucible/io/raw.h"
#include "crucible/io/text.h"
#include "test_util.h"

namespace crucible::io {
namespace {

using test::expect_bad_input;

std::string digest(const Array& a) {
  const std::vector<uint8_t> b = a.c_order_bytes();
  return sha256_hex(std::string(b.begin(), b.end()));
}

TEST(Npz, ReadsSavezAndSavezCompressed) {
  test::TempDir d;
  const std::string out = test::run_python("import numpy as np, hashlib\n"
                                           "a = np.arange(12, dtype='<f4').reshape(3, 4); b = np.array([1, -2, 3], dtype='>i8')\n"
                                           "np.savez('" + (d / "s.npz") + "', a=a, b=b)\n"
                                           "np.savez_compressed('" + (d / "c.npz") + "', a=a, b=b)\n"
                                           "for x in (a, b): print(hashlib.sha256(x.astype(x.dtype.newbyteorder('<')).tobytes()).hexdigest())\n");
  std::istringstream in(out);
  std::string sha_a, sha_b;
  in >> sha_a >> sha_b;
  for (const char* f : {"s.npz", "c.npz"}) {
    auto arrays = read_npz(d / f);
    ASSERT_EQ(arrays.size(), 2u) << f;
    EXPECT_EQ(arrays[0].name, "a");
    EXPECT_EQ(arrays[1].name, "b");
    EXPECT_EQ(arrays[0].array.shape_string(), "[3, 4]");
    EXPECT_EQ(digest(arrays[0].array), sha_a);
    EXPECT_EQ(digest(arrays[1].array), sha_b);
  }
}

TEST(Npz, NumpyReadsWhatCrucibleWrites) {
  test::TempDir d;
  std::vector<uint8_t> bytes(24);
  for (size_t i = 0; i < 24; ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  std::vector<NamedArray> arrays = {{"x", Array::owned(DType::kU8, {4, 6}, bytes)},
                                    {"y", Array::owned(DType::kI16, {12}, bytes)}};
  write_npz(d / "s.npz", arrays, false);
  write_npz(d / "c.npz", arrays, true);
  const std::string out = test::run_python(
      "import numpy as np, zipfile\n"
      "for f in ('s.npz', 'c.npz'):\n"
      "    z = np.load('" + d.path() + "/' + f)\n"
      "    m = zipfile.ZipFile('" + d.path() + "/' + f).infolist()[0].compress_type\n"
      "    print(f, sorted(z.files), z['x'].tolist()[1], z['y'].dtype, int(z['y'][5]), m)\n");
  EXPECT_EQ(out,
            "s.npz ['x', 'y'] [42, 49, 56, 63, 70, 77] int16 19782 0\n"
            "c.npz ['x', 'y'] [42, 49, 56, 63, 70, 77] int16 19782 8\n");
}

TEST(Npz, ZipBombAndCorruptMembersAreRefused) {
  test::TempDir d;
  // A deflated member whose directory entry claims 4 GB: refused before any allocation.
  test::run_python("import numpy as np, struct\n"
                   "np.savez_compressed('" + (d / "a.npz") + "', x=np.zeros(1000))\n"
                   "b = bytearray(open('" + (d / "a.npz") + "', 'rb').read())\n"
                   "for sig, off in ((b'PK\\x01\\x02', 24), (b'PK\\x03\\x04', 22)):\n"
                   "    i = b.find(sig)\n"
                   "    if b[i + off:i + off + 4] != b'\\xff\\xff\\xff\\xff':\n"
                   "        b[i + off:i + off + 4] = struct.pack('<I', 0xfffffff0)\n"
                   "    else:  # zip64: patch the 8-byte size in the extra field\n"
                   "        j = b.find(b'\\x01\\x00', i + 30)\n"
                   "        b[j + 4:j + 12] = struct.pack('<Q', 1 << 40)\n"
                   "open('" + (d / "bomb.npz") + "', 'wb').write(b)\n");
  expect_bad_input([&] { read_npz(d / "bomb.npz"); }, {"bomb.npz", "x.npy", "more than deflate can produce"});
  const std::string good = test::read_text(d / "a.npz");
  test::write_text(d / "cut.npz", good.substr(0, good.size() / 2));
  expect_bad_input([&] { read_npz(d / "cut.npz"); }, {"cut.npz"});
}

TEST(Raw, KittiPointsReadWithDeclaredDtypeAndShape) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.arange(40, dtype='<f4').reshape(10, 4).tofile('" + (d / "scan.bin") + "')\n"
                   "np.arange(10, dtype='<u4').tofile('" + (d / "scan.label") + "')\n");
  Array pts = read_raw(d / "scan.bin", RawSpec{DType::kF32, {-1, 4}});
  EXPECT_EQ(pts.shape_string(), "[10, 4]");
  float v;
  std::memcpy(&v, pts.data + 4 * 9, 4);
  EXPECT_EQ(v, 9.0f);
  EXPECT_EQ(read_raw(d / "scan.label", RawSpec{DType::kU32, {-1}}).numel(), 10);
  expect_bad_input([&] { read_raw(d / "scan.bin", RawSpec{DType::kF64, {-1, 3}}); },
                   {"scan.bin", "160 bytes", "not a multiple of 24", "--dtype"});
  expect_bad_input([&] { read_raw(d / "scan.bin", RawSpec{DType::kF32, {10, 5}}); },
                   {"holds 160 bytes", "needs 200 bytes"});
  write_raw(d / "copy.bin", pts);
  EXPECT_EQ(test::run_python("import numpy as np\n"
                             "a = np.fromfile('" + (d / "copy.bin") + "', dtype='<f4').reshape(-1, 4)\n"
                             "print(bool((a == np.arange(40).reshape(10, 4)).all()))\n"),
            "True\n");
  EXPECT_EQ(parse_shape("-1,4", "s"), (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(parse_shape("[3, 224, 224]", "s"), (std::vector<int64_t>{3, 224, 224}));
  EXPECT_THROW(parse_shape("-1,-1", "s"), Error);
  EXPECT_THROW(parse_shape("3,a4", "s"), Error);
}

TEST(Text, LoadtxtEqualsNumpyBitExact) {
  test::TempDir d;
  const std::string out = test::run_python(
      "import numpy as np, hashlib\n"
      "rng = np.random.default_rng(1); a = rng.standard_normal((7, 5)) * 1e3\n"
      "a[0, 0] = np.nan; a[1, 1] = -np.inf; a[2, 2] = 0.1\n"
      "np.savetxt('" + (d / "a.txt") + "', a)\n"
      "np.savetxt('" + (d / "b.csv") + "', a, delimiter=',', header='x,y,z,u,v')\n"
      "b = np.loadtxt('" + (d / "b.csv") + "', delimiter=',', usecols=(0, 2, -1))\n"
      "print(hashlib.sha256(a.tobytes()).hexdigest(), hashlib.sha256(np.ascontiguousarray(b).tobytes()).hexdigest())\n");
  std::istringstream in(out);
  std::string sha_a, sha_b;
  in >> sha_a >> sha_b;
  Array a = read_text(d / "a.txt", TextOptions{});
  EXPECT_EQ(a.shape_string(), "[7, 5]");
  EXPECT_EQ(digest(a), sha_a);
  TextOptions csv;
  csv.delimiter = ",";
  csv.use_cols = {0, 2, -1};
  Array b = read_text(d / "b.csv", csv);
  EXPECT_EQ(b.shape_string(), "[7, 3]");
  EXPECT_EQ(digest(b), sha_b);
}

TEST(Text, NumpyReadsWhatCrucibleWrites) {
  test::TempDir d;
  std::vector<double> v = {0.1, -2.5e-300, 3.0, 1e300, 5.25, -0.0};
  std::vector<uint8_t> bytes(v.size() * 8);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  write_text(d / "a.txt", Array::owned(DType::kF64, {2, 3}, bytes), TextOptions{});
  EXPECT_EQ(test::run_python("import numpy as np\n"
                             "a = np.loadtxt('" + (d / "a.txt") + "')\n"
                             "b = np.array([[0.1, -2.5e-300, 3.0], [1e300, 5.25, -0.0]])\n"
                             "print(a.shape, a.tobytes() == b.tobytes())\n"),
            "(2, 3) True\n");
  TextOptions o;
  o.fmt = "%.3f";
  o.delimiter = ",";
  write_text(d / "b.csv", Array::owned(DType::kF64, {2, 3}, bytes), o);
  EXPECT_EQ(test::read_text(d / "b.csv").substr(0, 19), "0.100,-0.000,3.000\n");
  o.fmt = "%s";
  expect_bad_input([&] { write_text(d / "c.txt", Array::owned(DType::kF64, {1}, std::vector<uint8_t>(8)), o); },
                   {"%s", "one conversion"});
}

TEST(Text, BadTokensAndRaggedRowsNameTheLine) {
  const std::string bad = "1 2 3\n4 five 6\n";
  expect_bad_input([&] { parse_text(bad.data(), bad.size(), "t.txt", TextOptions{}); },
                   {"t.txt:2", "column 2", "'five'"});
  const std::string ragged = "# header\n1 2 3\n4 5\n";
  expect_bad_input([&] { parse_text(ragged.data(), ragged.size(), "t.txt", TextOptions{}); },
                   {"t.txt:3", "2 columns", "have 3"});
  const std::string skip = "a b c\n1 2 3 # trailing comment\n\n4 5 6\n";
  TextOptions o;
  o.skip_rows = 1;
  Array a = parse_text(skip.data(), skip.size(), "t.txt", o);
  EXPECT_EQ(a.shape_string(), "[2, 3]");
}

}  // namespace
}  // namespace crucible::io
