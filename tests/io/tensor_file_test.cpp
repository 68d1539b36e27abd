// Format detection from content, not extension (D12), and conversions between every writable
// format that come back bit-exact.
#include "crucible/io/tensor_file.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/io/idx.h"
#include "crucible/io/npy.h"
#include "crucible/io/npz.h"
#include "crucible/io/safetensors.h"
#include "test_util.h"

namespace crucible::io {
namespace {

using test::expect_bad_input;

Array sample() {
  std::vector<uint8_t> b(4 * 6);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 11 + 3);
  return Array::owned(DType::kF32, {2, 3}, b);
}

TEST(TensorFile, DetectsFormatFromContentNotExtensionD12) {
  test::TempDir d;
  write_npy(d / "npy.bin", sample());  // misleading extensions on purpose
  write_npz(d / "npz.dat", {{"a", sample()}}, false);
  write_safetensors(d / "st.npy", {{"a", sample()}}, {});
  write_idx(d / "idx.txt", IdxArray{DType::kU8, {2, 2}, {1, 2, 3, 4}}, false);
  write_idx(d / "idxgz.npy", IdxArray{DType::kU8, {2, 2}, {1, 2, 3, 4}}, true);
  test::write_text(d / "t.bin", "1 2 3\n4 5 6\n");
  test::write_text(d / "raw.npy", std::string("\x01\xff\x80\x7f\x00\x10\x20\x30", 8));
  EXPECT_EQ(detect_file_format(d / "npy.bin"), Format::kNpy);
  EXPECT_EQ(detect_file_format(d / "npz.dat"), Format::kNpz);
  EXPECT_EQ(detect_file_format(d / "st.npy"), Format::kSafetensors);
  EXPECT_EQ(detect_file_format(d / "idx.txt"), Format::kIdx);
  bool gz = false;
  EXPECT_EQ(detect_file_format(d / "idxgz.npy", &gz), Format::kIdx);
  EXPECT_TRUE(gz);
  EXPECT_EQ(detect_file_format(d / "t.bin"), Format::kText);
  EXPECT_EQ(detect_file_format(d / "raw.npy"), Format::kUnknown);
  EXPECT_EQ(read_tensors(d / "idxgz.npy").arrays[0].array.numel(), 4);
  // A raw file without a declared dtype: the message says how to read it.
  expect_bad_input([&] { read_tensors(d / "raw.npy"); }, {"raw.npy", "cannot tell the format", "--dtype", "--shape"});
  // np.fromfile on an .npy is the classic mistake: --dtype on a file with a header is refused.
  ReadOptions raw;
  raw.raw = RawSpec{DType::kF32, {-1}};
  expect_bad_input([&] { read_tensors(d / "npy.bin", raw); }, {"is a npy file", "states its own dtype"});
  EXPECT_EQ(read_tensors(d / "raw.npy", ReadOptions{RawSpec{DType::kU16, {-1}}, {}}).arrays[0].array.numel(), 4);
}

TEST(TensorFile, ConversionsRoundTripBitExact) {
  test::TempDir d;
  TensorSet set;
  set.arrays.push_back({"w", sample()});
  const std::vector<uint8_t> want = sample().c_order_bytes();
  // npy → safetensors → npz (deflated) → raw → npy, each read back from disk.
  write_tensors(d / "a.npy", Format::kNpy, set);
  TensorSet s1 = read_tensors(d / "a.npy");
  write_tensors(d / "b.safetensors", Format::kSafetensors, s1);
  TensorSet s2 = read_tensors(d / "b.safetensors");
  EXPECT_EQ(s2.arrays[0].name, "a");  // single-array files are named after the file
  write_tensors(d / "c.npz", Format::kNpz, s2, WriteOptions{true, {}});
  TensorSet s3 = read_tensors(d / "c.npz");
  write_tensors(d / "d.bin", Format::kRaw, s3);
  TensorSet s4 = read_tensors(d / "d.bin", ReadOptions{RawSpec{DType::kF32, {2, 3}}, {}});
  write_tensors(d / "e.npy", Format::kNpy, s4);
  TensorSet s5 = read_tensors(d / "e.npy");
  EXPECT_EQ(s5.arrays[0].array.c_order_bytes(), want);
  EXPECT_EQ(s5.arrays[0].array.shape_string(), "[2, 3]");
  // Two arrays into a single-array format: refused with the names.
  TensorSet two = set;
  two.arrays.push_back({"v", sample()});
  expect_bad_input([&] { write_tensors(d / "x.npy", Format::kNpy, two); }, {"holds one array", "w, v", "--name"});
  expect_bad_input([&] { format_for_extension("out.h5"); }, {".h5", ".safetensors"});
}

TEST(TensorFile, StatsCountNanAndInf) {
  std::vector<float> v = {1.0f, -3.0f, NAN, INFINITY, 5.0f};
  std::vector<uint8_t> b(20);
  std::memcpy(b.data(), v.data(), 20);
  ArrayStats s = array_stats(Array::owned(DType::kF32, {5}, b), "x");
  EXPECT_EQ(s.min, -3.0);
  EXPECT_EQ(s.max, 5.0);
  EXPECT_EQ(s.mean, 1.0);
  EXPECT_EQ(s.nan, 1);
  EXPECT_EQ(s.inf, 1);
}

}  // namespace
}  // namespace crucible::io
