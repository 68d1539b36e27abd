// Transforms: RandomResizedCrop keeps torchvision's semantics (area and ratio ranges, the
// deterministic fallback compared with torchvision itself), the resize matches PIL's
// antialiased bilinear within rounding, and the flip mirrors rows.
#include "crucible/data/transforms/transform.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <sstream>

#include "test_util.h"

namespace crucible::data {
namespace {

TEST(RandomResizedCrop, AreaAndRatioWithinTorchvisionRanges) {
  int fallback = 0;
  for (uint64_t i = 0; i < 5000; ++i) {
    SampleRng rng(7, 0, i);
    const Rect r = random_resized_crop(500, 375, rng);
    ASSERT_GE(r.x, 0);
    ASSERT_GE(r.y, 0);
    ASSERT_LE(r.x + r.width, 500);
    ASSERT_LE(r.y + r.height, 375);
    const double area = static_cast<double>(r.width) * r.height / (500.0 * 375.0);
    const double ratio = static_cast<double>(r.width) / r.height;
    if (r.width == 375 * 4 / 3 + 0 && r.height == 375) ++fallback;
    EXPECT_GE(area, 0.07);  // rounding of w and h
    EXPECT_LE(area, 1.0);
    EXPECT_GE(ratio, 0.74);
    EXPECT_LE(ratio, 1.35);
  }
  EXPECT_LT(fallback, 250);  // the fallback is rare on a 4:3 image
}

TEST(RandomResizedCrop, FallbackEqualsTorchvision) {
  // A 1000×10 image: no try can fit, so torchvision falls back to a centre crop clamped to the
  // ratio range — deterministic, so torchvision is the oracle.
  const std::string out = test::run_python(
      "import torch\nfrom torchvision.transforms import RandomResizedCrop\n"
      "img = torch.zeros(3, 10, 1000)\n"
      "print(*RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3/4, 4/3)))\n"
      "img = torch.zeros(3, 1000, 10)\n"
      "print(*RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3/4, 4/3)))\n");
  std::istringstream in(out);
  int i, j, h, w;
  SampleRng rng(1, 0, 0);
  in >> i >> j >> h >> w;
  Rect r = random_resized_crop(1000, 10, rng);
  EXPECT_EQ(r.y, i);
  EXPECT_EQ(r.x, j);
  EXPECT_EQ(r.height, h);
  EXPECT_EQ(r.width, w);
  in >> i >> j >> h >> w;
  r = random_resized_crop(10, 1000, rng);
  EXPECT_EQ(r.y, i);
  EXPECT_EQ(r.x, j);
  EXPECT_EQ(r.height, h);
  EXPECT_EQ(r.width, w);
}

TEST(CenterCrop, KeepsTheCentralFraction) {
  const Rect r = center_crop_region(500, 375);  // Resize(256) + CenterCrop(224) on 500×375
  EXPECT_EQ(r.width, 328);
  EXPECT_EQ(r.height, 328);
  EXPECT_EQ(r.x, 86);
  EXPECT_EQ(r.y, 23);
}

// The evaluation geometry against torchvision 0.14's own arithmetic (transforms.Resize's
// output size, CenterCrop's Python round, half to even) for every size from 1 to 300 against a
// few others and assorted crops: the resized size and the crop's corner are equal.
TEST(ResizeCentreCrop, EqualsTorchvisionResizeAndCenterCropArithmetic) {
  const std::string out = test::run_python(
      "from torchvision.transforms.functional import _compute_resized_output_size as size\n"
      "for crop in (224, 32, 100, 7, 1):\n"
      "    for w in range(1, 301):\n"
      "        for h in (1, 3, 32, 37, 100, 255, 256, 257, 375, 1000):\n"
      "            for a, b in ((w, h), (h, w)):\n"
      "                rh, rw = size((b, a), [int(crop / 0.875)])\n"
      "                print(crop, a, b, rw, rh, int(round((rw - crop) / 2.0)), int(round((rh - crop) / 2.0)))\n");
  std::istringstream in(out);
  int crop, w, h, rw, rh, left, top, n = 0, bad = 0;
  while (in >> crop >> w >> h >> rw >> rh >> left >> top) {
    ++n;
    const ResizeCentreCrop r = resize_centre_crop(w, h, crop);
    if (r.resized_width != rw || r.resized_height != rh || r.left != left || r.top != top) {
      if (++bad <= 10) {
        ADD_FAILURE() << w << "x" << h << " crop " << crop << ": torchvision " << rw << "x" << rh << " at (" << left
                      << ", " << top << "), crucible " << r.resized_width << "x" << r.resized_height << " at ("
                      << r.left << ", " << r.top << ")";
      }
    }
  }
  EXPECT_EQ(n, 5 * 300 * 10 * 2);
  EXPECT_EQ(bad, 0);
  // The ImageNet recipe on a 500×375 photo: Resize(256) → 341×256, CenterCrop(224) at (58, 16)
  // (58.5 rounds to even).
  const ResizeCentreCrop r = resize_centre_crop(500, 375, 224);
  EXPECT_EQ(r.resized_width, 341);
  EXPECT_EQ(r.resized_height, 256);
  EXPECT_EQ(r.left, 58);
  EXPECT_EQ(r.top, 16);
}

TEST(Resize, MatchesPilBilinearAntialiased) {
  test::TempDir d;
  const int sw = 97, sh = 61;
  std::vector<uint8_t> src(static_cast<size_t>(sw) * sh * 3);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>((k * 2654435761u) >> 24);
  test::write_text(d / "src.raw", std::string(src.begin(), src.end()));
  for (auto [dw, dh] : {std::pair<int, int>{40, 25}, {150, 90}, {97, 30}}) {
    std::vector<uint8_t> dst(static_cast<size_t>(dw) * dh * 3);
    resize_image(src.data(), sw, sh, sw * 3, 3, dst.data(), dw, dh);
    const std::string out = test::run_python(
        "import numpy as np\nfrom PIL import Image\n"
        "a = np.fromfile('" + (d / "src.raw") + "', np.uint8).reshape(" + std::to_string(sh) + ", " + std::to_string(sw) +
        ", 3)\n"
        "b = np.asarray(Image.fromarray(a).resize((" + std::to_string(dw) + ", " + std::to_string(dh) +
        "), Image.BILINEAR)).astype(int)\n"
        "c = np.frombuffer(bytes.fromhex('" + [&] {
          std::string hex;
          static const char* k = "0123456789abcdef";
          for (uint8_t v : dst) {
            hex += k[v >> 4];
            hex += k[v & 15];
          }
          return hex;
        }() + "'), np.uint8).reshape(b.shape).astype(int)\n"
              "print(int(np.abs(b - c).max()), float(np.abs(b - c).mean()))\n");
    std::istringstream in(out);
    int max_diff;
    double mean_diff;
    in >> max_diff >> mean_diff;
    EXPECT_LE(max_diff, 2) << dw << "x" << dh;
    EXPECT_LT(mean_diff, 0.5) << dw << "x" << dh;
  }
}

TEST(Flip, MirrorsEveryRow) {
  std::vector<uint8_t> px = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 2 rows × 2 pixels × 3
  hflip_image(px.data(), 2, 2, 3);
  EXPECT_EQ(px, (std::vector<uint8_t>{4, 5, 6, 1, 2, 3, 10, 11, 12, 7, 8, 9}));
}

// Every width up to 100 and a wide row (the SSSE3 loop's 16-pixel blocks from both ends and the
// middle it leaves), against the mirror written pixel by pixel; 1 and 4 channels too.
TEST(Flip, EveryWidthEqualsThePixelByPixelMirror) {
  for (int channels : {3, 1, 4}) {
    for (int w = 1; w <= 1030; w += (w < 100 ? 1 : 233)) {
      const int h = 3;
      std::vector<uint8_t> px(static_cast<size_t>(w) * h * channels);
      for (size_t k = 0; k < px.size(); ++k) px[k] = static_cast<uint8_t>(k * 37 + k / 7);
      std::vector<uint8_t> want(px.size());
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          for (int c = 0; c < channels; ++c) {
            want[(static_cast<size_t>(y) * w + x) * channels + c] = px[(static_cast<size_t>(y) * w + (w - 1 - x)) * channels + c];
          }
        }
      }
      hflip_image(px.data(), w, h, channels);
      ASSERT_EQ(px, want) << w << " pixels of " << channels << " channels";
    }
  }
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

TEST(Resize, FlipOnTheWayEqualsFlipAfter) {
  std::vector<uint8_t> src(53 * 37 * 3);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>(k * 31 + 7);
  std::vector<uint8_t> a(24 * 20 * 3), b(24 * 20 * 3);
  resize_image(src.data(), 53, 37, 53 * 3, 3, a.data(), 24, 20, /*flip=*/false);
  hflip_image(a.data(), 24, 20, 3);
  resize_image(src.data(), 53, 37, 53 * 3, 3, b.data(), 24, 20, /*flip=*/true);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

// The AVX2 kernels (pmaddwd on pairs of rows and of taps) against the portable ones: the same
// integer arithmetic, so the same bytes, for upscales and downscales of every tap count, odd
// widths (the 16-byte and 2-pixel tails), padded source rows, flipped and planar output. And
// planar output is the interleaved output transposed.
TEST(Resize, Avx2KernelsEqualThePortableOnesAndPlanarIsTheTranspose) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 on this CPU";
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  int cases = 0;
  for (auto [sw, sh, dw, dh] : {std::array<int, 4>{97, 61, 40, 25}, {97, 61, 150, 90}, {300, 260, 224, 224},
                                {500, 400, 224, 224}, {98, 106, 224, 224}, {1, 1, 7, 5}, {33, 17, 1, 1},
                                {640, 480, 128, 128}, {17, 900, 31, 29}, {224, 224, 224, 224}}) {
    const int stride = sw * 3 + static_cast<int>(next() % 13);  // libjpeg's padded rows
    std::vector<uint8_t> src(static_cast<size_t>(stride) * sh + 16);
    for (auto& v : src) v = static_cast<uint8_t>(next() >> 24);
    for (bool flip : {false, true}) {
      for (bool planar : {false, true}) {
        const size_t n = static_cast<size_t>(dw) * dh * 3;
        std::vector<uint8_t> simd(n), portable(n);
        use_resize_avx2_for_testing(true);
        resize_image(src.data(), sw, sh, stride, 3, simd.data(), dw, dh, flip, planar);
        use_resize_avx2_for_testing(false);
        resize_image(src.data(), sw, sh, stride, 3, portable.data(), dw, dh, flip, planar);
        use_resize_avx2_for_testing(true);
        ASSERT_EQ(simd, portable) << sw << "x" << sh << " -> " << dw << "x" << dh << " flip " << flip << " planar "
                                  << planar;
        if (planar) {
          std::vector<uint8_t> hwc(n);
          resize_image(src.data(), sw, sh, stride, 3, hwc.data(), dw, dh, flip, false);
          for (size_t p = 0; p < static_cast<size_t>(dw) * dh; ++p) {
            for (size_t c = 0; c < 3; ++c) {
              ASSERT_EQ(simd[c * dw * dh + p], hwc[p * 3 + c]) << "pixel " << p << " channel " << c;
            }
          }
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 40);
}

}  // namespace
}  // namespace crucible::data
