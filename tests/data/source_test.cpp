// IDX sources: image and label files must agree; the real Fashion-MNIST files from Debian's
// dataset-fashion-mnist load with the shapes and label counts NumPy sees.
#include "crucible/data/formats/source.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/io/idx.h"
#include "test_util.h"

namespace crucible::data {
namespace {

const char* kFm = "/usr/share/datasets/fashion-mnist/";

TEST(IdxSource, MismatchedCountsAreBadInput) {
  test::TempDir d;
  io::IdxArray img{io::DType::kU8, {5, 4, 4}, std::vector<uint8_t>(80, 1)};
  io::IdxArray lab{io::DType::kU8, {4}, std::vector<uint8_t>{0, 1, 2, 3}};
  io::write_idx(d / "img", img, false);
  io::write_idx(d / "lab", lab, true);
  try {
    load_idx_source(d / "img", d / "lab");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 images"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 labels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_idx_source(d / "lab", d / "lab"), Error);  // labels are not images
}

TEST(IdxSource, LimitKeepsTheFirstSamples) {
  test::TempDir d;
  std::vector<uint8_t> px(6 * 4);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  io::write_idx(d / "img", io::IdxArray{io::DType::kU8, {6, 2, 2}, px}, false);
  io::write_idx(d / "lab", io::IdxArray{io::DType::kU8, {6}, {5, 4, 3, 2, 1, 0}}, false);
  auto s = load_idx_source(d / "img", d / "lab", 3);
  EXPECT_EQ(s->size(), 3);
  EXPECT_EQ(s->label(2), 3);
  EXPECT_EQ(s->pixels(2)[0], 8);
  EXPECT_EQ(s->num_classes(), 6);
}

TEST(IdxSource, FashionMnistMatchesNumpy) {
  auto s = load_idx_source(std::string(kFm) + "t10k-images-idx3-ubyte.gz", std::string(kFm) + "t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(s->size(), 10000);
  EXPECT_EQ(s->spec().height, 28);
  EXPECT_EQ(s->spec().width, 28);
  EXPECT_EQ(s->num_classes(), 10);
  int64_t pixel_sum = 0, label_sum = 0;
  for (int64_t i = 0; i < s->size(); ++i) {
    label_sum += s->label(i);
    for (int k = 0; k < 784; ++k) pixel_sum += s->pixels(i)[k];
  }
  const std::string out = test::run_python(
      "import gzip, numpy as np\n"
      "r = '" + std::string(kFm) + "'\n"
      "x = np.frombuffer(gzip.open(r + 't10k-images-idx3-ubyte.gz').read()[16:], np.uint8)\n"
      "y = np.frombuffer(gzip.open(r + 't10k-labels-idx1-ubyte.gz').read()[8:], np.uint8)\n"
      "print(int(x.astype(np.int64).sum()), int(y.astype(np.int64).sum()))\n");
  EXPECT_EQ(out, std::to_string(pixel_sum) + " " + std::to_string(label_sum) + "\n");
}

}  // namespace
}  // namespace crucible::data
