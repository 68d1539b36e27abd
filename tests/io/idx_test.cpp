// IDX reader: every type code round-trips (gzip and plain), a file written by Python reads
// back equal, and malformed files give bad-input errors naming the file and what was
// expected — never a crash or an allocation the file cannot justify.
#include "crucible/io/idx.h"

#include <gtest/gtest.h>

#include <cstring>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::io {
namespace {

IdxArray make(DType t, std::vector<int64_t> shape) {
  IdxArray a;
  a.dtype = t;
  a.shape = shape;
  size_t n = dtype_size(t);
  for (auto d : shape) n *= static_cast<size_t>(d);
  a.data.resize(n);
  for (size_t i = 0; i < n; ++i) a.data[i] = static_cast<uint8_t>(i * 37 + 11);
  return a;
}

using test::expect_bad_input;

TEST(Idx, EveryTypeRoundTripsGzipAndPlain) {
  test::TempDir d;
  for (DType t : {DType::kU8, DType::kI8, DType::kI16, DType::kI32, DType::kF32, DType::kF64}) {
    for (bool gz : {false, true}) {
      IdxArray a = make(t, {3, 5, 7});
      const std::string path = d / (std::string(dtype_name(t)) + (gz ? ".gz" : ""));
      write_idx(path, a, gz);
      IdxArray b = read_idx(path);
      EXPECT_EQ(b.dtype, t);
      EXPECT_EQ(b.shape, a.shape);
      EXPECT_EQ(b.data, a.data) << dtype_name(t) << (gz ? " gz" : "");
    }
  }
}

TEST(Idx, ReadsBigEndianFileWrittenByPython) {
  test::TempDir d;
  const std::string path = d / "py.idx.gz";
  test::run_python("import gzip, numpy as np, struct\n"
                   "a = (np.arange(2*3*4) * 1000 - 5000).astype('>i4').reshape(2, 3, 4)\n"
                   "with gzip.open('" + path + "', 'wb') as f:\n"
                   "    f.write(bytes([0, 0, 0x0C, 3]) + struct.pack('>3I', 2, 3, 4) + a.tobytes())\n");
  IdxArray b = read_idx(path);
  ASSERT_EQ(b.shape, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(b.dtype, DType::kI32);
  std::vector<int32_t> v(24);
  std::memcpy(v.data(), b.data.data(), 96);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], i * 1000 - 5000);
}

TEST(Idx, MalformedFilesAreBadInput) {
  test::TempDir d;
  write_idx(d / "good", make(DType::kU8, {4, 4}), false);
  const std::string good = test::read_text(d / "good");

  test::write_text(d / "magic", std::string("\x01\x02\x08\x02", 4) + good.substr(4));
  expect_bad_input([&] { read_idx(d / "magic"); }, {"magic", "not an IDX file"});

  std::string type = good;
  type[2] = 0x42;
  test::write_text(d / "type", type);
  expect_bad_input([&] { read_idx(d / "type"); }, {"type code 0x42"});

  test::write_text(d / "short", good.substr(0, good.size() - 3));
  expect_bad_input([&] { read_idx(d / "short"); }, {"size mismatch", "16 bytes"});

  test::write_text(d / "long", good + "xyz");
  expect_bad_input([&] { read_idx(d / "long"); }, {"size mismatch"});

  test::write_text(d / "hdr", good.substr(0, 6));
  expect_bad_input([&] { read_idx(d / "hdr"); }, {"truncated IDX header"});

  // A gzip file whose header claims far more data than any gzip of its size can hold.
  IdxArray huge = make(DType::kU8, {1});
  write_idx(d / "bomb.gz", huge, true);
  std::string hdr = std::string("\x00\x00\x08\x03", 4) + std::string("\x7f\xff\xff\xff\x00\x00\x00\x10\x00\x00\x00\x10", 12);
  test::write_text(d / "bomb", hdr);
  test::run_python("import gzip\nopen('" + (d / "bomb.gz") + "','wb').write(gzip.compress(open('" + (d / "bomb") +
                   "','rb').read()))\n");
  expect_bad_input([&] { read_idx(d / "bomb.gz"); }, {"more than a", "gzip file can hold"});

  expect_bad_input([&] { read_idx(d / "missing"); }, {"cannot open", "missing"});
}

TEST(Idx, TruncatedGzipIsBadInput) {
  test::TempDir d;
  write_idx(d / "a.gz", make(DType::kF32, {64, 64}), true);
  const std::string gz = test::read_text(d / "a.gz");
  test::write_text(d / "cut.gz", gz.substr(0, gz.size() / 2));
  try {
    read_idx(d / "cut.gz");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("cut.gz"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace crucible::io
