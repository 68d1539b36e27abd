// The warps (affine, rotate) have a scalar path and an AVX2 path that computes eight pixels at a
// time with the same float operations in the same order: both must give the same bytes, for
// nearest and bilinear, with and without a fill, planar and interleaved, 1 and 3 channels, and
// widths that leave a tail after the blocks of eight. (Both are compared with torchvision by
// tests/python/test_transforms.py; this checks that the CPU's choice changes nothing.)
#include "crucible/data/image/image_ops.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include <fmt/format.h>

namespace crucible::data::ops {
namespace {

TEST(ImageOps, VectorAndScalarWarpsGiveTheSameBytes) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> angle(-40, 40), shear(-25, 25), shift(-12, 12), scale(0.6, 1.4);
  int cases = 0, moved = 0;
  for (int w : {8, 13, 37, 224}) {
    for (int h : {5, 31}) {
      for (int channels : {1, 3}) {
        for (bool planar : {false, true}) {
          for (Interpolation mode : {Interpolation::kNearest, Interpolation::kBilinear}) {
            for (bool filled : {false, true}) {
              std::vector<uint8_t> image(static_cast<size_t>(w) * h * channels);
              for (auto& p : image) p = static_cast<uint8_t>(gen() & 0xff);
              Fill fill;
              fill.set = filled;
              fill.value = {17.5f, 200.0f, 3.0f};
              const double a = angle(gen), sx = shear(gen), sy = shear(gen), tx = shift(gen), ty = shift(gen),
                           s = scale(gen);
              std::vector<uint8_t> vec = image, scalar = image;
              testing::set_vector_warp(true);
              affine({vec.data(), w, h, channels, planar}, a, tx, ty, s, sx, sy, mode, fill);
              testing::set_vector_warp(false);
              affine({scalar.data(), w, h, channels, planar}, a, tx, ty, s, sx, sy, mode, fill);
              ASSERT_EQ(vec, scalar) << fmt::format("{}x{}x{} planar {} {} fill {}: angle {} shear {} {} translate {} {} "
                                                    "scale {}",
                                                    w, h, channels, planar, interpolation_name(mode), filled, a, sx, sy,
                                                    tx, ty, s);
              std::vector<uint8_t> rv = image, rs = image;
              testing::set_vector_warp(true);
              rotate({rv.data(), w, h, channels, planar}, a, mode, fill);
              testing::set_vector_warp(false);
              rotate({rs.data(), w, h, channels, planar}, a, mode, fill);
              ASSERT_EQ(rv, rs) << fmt::format("rotate {} on {}x{}x{}", a, w, h, channels);
              moved += vec != image;
              ++cases;
            }
          }
        }
      }
    }
  }
  testing::set_vector_warp(true);
  EXPECT_EQ(cases, 128);
  EXPECT_GT(moved, 120);  // the warps did something
}

}  // namespace
}  // namespace crucible::data::ops
