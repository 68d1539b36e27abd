// D13: arrays from files become tensors without a copy. A 2 GB float32 .npy opens as a tensor
// with no resident memory until touched (checked by RSS); Fortran-order and shared views keep
// their layout; writes to the tensor never reach the file.
#include "crucible/io/tensor.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "crucible/io/npy.h"
#include "test_util.h"

namespace crucible::io {
namespace {

int64_t rss_kb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(NpyTensor, TwoGigabyteFileOpensWithoutResidentMemoryD13) {
  test::TempDir d;
  const int64_t n = (int64_t{2} << 30) / 4;  // 2 GiB of float32
  Array header = Array::owned(DType::kF32, {n}, {});
  header.data = nullptr;
  const std::string h = npy_header(header, "big.npy");
  {
    // A sparse file: the header, then 2 GiB that take no disk space until written.
    int fd = ::open((d / "big.npy").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, h.data(), h.size()), static_cast<ssize_t>(h.size()));
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(h.size() + static_cast<size_t>(n) * 4)), 0);
    float v = 42.5f;
    ASSERT_EQ(::pwrite(fd, &v, 4, static_cast<off_t>(h.size() + 4 * 1000)), 4);
    ::close(fd);
  }
  const int64_t before = rss_kb();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor t = load_npy_tensor(d / "big.npy");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t after_open = rss_kb();
  EXPECT_EQ(t.numel(), n);
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_LT(after_open - before, 16 * 1024) << "opening must not read the data";
  EXPECT_EQ(t[1000].item<float>(), 42.5f);  // touching one element reads one page
  EXPECT_LT(rss_kb() - before, 16 * 1024);
  std::printf("2 GiB .npy opened as a tensor in %.4f s, RSS +%lld KiB\n", secs,
              static_cast<long long>(rss_kb() - before));
  t[1000] = 1.0f;  // private copy-on-write: the file keeps 42.5
  EXPECT_EQ(load_npy_tensor(d / "big.npy")[1000].item<float>(), 42.5f);
}

TEST(NpyTensor, FortranOrderKeepsValues) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.save('" + (d / "f.npy") + "', np.asfortranarray(np.arange(24, dtype='<i8').reshape(2, 3, 4)))\n"
                   "np.save('" + (d / "b.npy") + "', np.arange(6, dtype='>f8').reshape(2, 3))\n");
  at::Tensor f = load_npy_tensor(d / "f.npy");
  EXPECT_TRUE(at::equal(f, at::arange(24, at::kLong).view({2, 3, 4})));
  EXPECT_FALSE(f.is_contiguous());  // a view with Fortran strides, not a copy
  EXPECT_TRUE(at::equal(load_npy_tensor(d / "b.npy"), at::arange(6, at::kDouble).view({2, 3})));
}

TEST(NpyTensor, TensorToArrayRoundTrip) {
  at::Tensor t = at::randn({3, 5}).t();
  Array a = to_array(t, "t");
  EXPECT_EQ(a.shape_string(), "[5, 3]");
  EXPECT_TRUE(at::equal(to_tensor(a), t));
}

}  // namespace
}  // namespace crucible::io
