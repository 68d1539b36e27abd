// OpenCV's arithmetic in crucible's YOLOX pipeline (yolox.h, namespace cv4): the AVX2 loops give the
// bytes of the scalar ones, on images of every small width and height (each loop's edges: the last
// pixels it leaves to the scalar code, the squares that reach outside the image, OpenCV's 64-pixel
// HSV blocks). The scalar loops themselves are held to cv2 by tests/python/test_detection_yolox.py,
// which runs the vector ones where the CPU has AVX2.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "crucible/data/transforms/yolox.h"

namespace crucible::data::cv4 {
namespace {

std::vector<uint8_t> noise(std::mt19937& gen, size_t n, int top = 256) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen() % top);
  return v;
}

// Runs `f` with the vector loops on, then off: the two outputs.
template <typename F>
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> both(size_t out_bytes, F f) {
  std::vector<uint8_t> vec(out_bytes, 7), scalar(out_bytes, 9);
  const bool before = use_vector_loops(true);
  f(vec.data());
  use_vector_loops(false);
  f(scalar.data());
  use_vector_loops(before);
  return {vec, scalar};
}

TEST(YoloxKernels, VectorLoopsEqualTheScalarOnesByteForByte) {
  std::mt19937 gen(47);
  int checked = 0;
  for (int w = 1; w <= 70; w += (w < 20 ? 1 : 7)) {
    for (int h = 1; h <= 9; h += 2) {
      const std::vector<uint8_t> img = noise(gen, static_cast<size_t>(w) * h * 3);
      // resize: up, down, by exactly 2, to the same size.
      for (const auto& size : std::vector<std::pair<int, int>>{{w * 2 + 3, h + 1}, {std::max(1, w / 3), h},
                                                               {std::max(1, w / 2), std::max(1, h / 2)}, {w, h}}) {
        const int dw = size.first, dh = size.second;  // not a structured binding: lambdas capture it (C++17)
        auto [a, b] = both(static_cast<size_t>(dw) * dh * 3,
                           [&](uint8_t* out) { resize_linear(img.data(), w, h, 3, out, dw, dh); });
        ASSERT_EQ(a, b) << "resize " << w << "x" << h << " to " << dw << "x" << dh;
        ++checked;
      }
      // warpAffine: rotated, scaled and moved so that part of the output falls outside the image.
      for (int k = 0; k < 3; ++k) {
        const double angle = (static_cast<int>(gen() % 60) - 30) * 3.14159265358979 / 180;
        const double scale = 0.5 + (gen() % 100) / 50.0;
        const double m[6] = {std::cos(angle) * scale, std::sin(angle) * scale, (gen() % 21) - 10.0,
                             -std::sin(angle) * scale, std::cos(angle) * scale, (gen() % 21) - 10.0};
        const int dw = 1 + static_cast<int>(gen() % 40), dh = 1 + static_cast<int>(gen() % 12);
        const uint8_t border[3] = {114, 114, 114};
        auto [a, b] = both(static_cast<size_t>(dw) * dh * 3,
                           [&](uint8_t* out) { warp_affine(img.data(), w, h, out, dw, dh, m, border); });
        ASSERT_EQ(a, b) << "warpAffine of " << w << "x" << h << " to " << dw << "x" << dh;
        ++checked;
      }
      // HSV both ways, and the fused jitter against the two passes with YOLOX's shifts between.
      const auto hsv_pair = both(img.size(), [&](uint8_t* out) { rgb_to_hsv(img.data(), out, w, h); });
      const std::vector<uint8_t>& hsv = hsv_pair.first;
      const std::vector<uint8_t>& hsv_scalar = hsv_pair.second;
      ASSERT_EQ(hsv, hsv_scalar) << "rgb_to_hsv " << w << "x" << h;
      auto [rgb, rgb_scalar] = both(img.size(), [&](uint8_t* out) { hsv_to_rgb(hsv.data(), out, w, h); });
      ASSERT_EQ(rgb, rgb_scalar) << "hsv_to_rgb " << w << "x" << h;
      const std::array<int, 3> gains = {static_cast<int>(gen() % 11) - 5, static_cast<int>(gen() % 61) - 30,
                                        static_cast<int>(gen() % 61) - 30};
      std::vector<uint8_t> shifted = hsv_scalar;
      for (size_t i = 0; i < shifted.size(); i += 3) {
        shifted[i] = static_cast<uint8_t>(((shifted[i] + gains[0]) % 180 + 180) % 180);
        shifted[i + 1] = static_cast<uint8_t>(std::clamp(shifted[i + 1] + gains[1], 0, 255));
        shifted[i + 2] = static_cast<uint8_t>(std::clamp(shifted[i + 2] + gains[2], 0, 255));
      }
      std::vector<uint8_t> two_passes(img.size());
      use_vector_loops(false);
      hsv_to_rgb(shifted.data(), two_passes.data(), w, h);
      use_vector_loops(true);
      auto [fused, fused_scalar] = both(img.size(), [&](uint8_t* out) {
        std::copy(img.begin(), img.end(), out);
        hsv_jitter(out, w, h, gains);
      });
      ASSERT_EQ(fused, fused_scalar) << "hsv_jitter " << w << "x" << h;
      ASSERT_EQ(fused, two_passes) << "hsv_jitter against the three passes, " << w << "x" << h;
      checked += 4;
    }
  }
  // Rows of OpenCV's 64-pixel HSV blocks and their tail, on a wide image.
  const int w = 200, h = 3;
  const std::vector<uint8_t> wide = noise(gen, static_cast<size_t>(w) * h * 3);
  auto [a, b] = both(wide.size(), [&](uint8_t* out) {
    std::copy(wide.begin(), wide.end(), out);
    hsv_jitter(out, w, h, {3, -20, 17});
  });
  EXPECT_EQ(a, b);
  EXPECT_GT(checked, 500);
}

TEST(YoloxKernels, AHueOutOfRangeIsNamedWithOrWithoutTheVectorLoops) {
  std::vector<uint8_t> hsv(16 * 3, 0), rgb(16 * 3);
  hsv[3 * 5] = 200;
  for (bool vector : {true, false}) {
    const bool before = use_vector_loops(vector);
    try {
      hsv_to_rgb(hsv.data(), rgb.data(), 16, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("hue 200 past 179"), std::string::npos) << e.what();
    }
    use_vector_loops(before);
  }
}

}  // namespace
}  // namespace crucible::data::cv4
