// OpenCV 4.x's uint8 arithmetic that YOLOX's pipeline runs (see yolox.h, namespace cv4): resize
// INTER_LINEAR, warpAffine INTER_LINEAR with a constant border, and the uint8 HSV conversions,
// each written after OpenCV's imgproc (resize.cpp, imgwarp.cpp, color_hsv.simd.hpp) and held to
// cv2 byte for byte by tests/python/test_detection_yolox.py. Compiled with -ffp-contract=off:
// every fused multiply-add below is OpenCV's (its AVX-512 build fuses 1 - s*h), written as fmaf.
// Hand-written: Debian's libopencv-imgproc would do these, at the price of OpenCV in the data layer
// and pixels that follow its CPU dispatch (docs/DESIGN.md, Dependencies: a decision left open).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "crucible/core/error.h"
#include "crucible/data/transforms/yolox.h"

// The loop is compiled with AVX2 and without, the CPU picking at load time (GCC's target_clones,
// as image_ops.cpp's FMA loops; same results). Not under clang: its ifunc resolvers run before a
// sanitizer's runtime is up (the TSan build crashed at load).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CRUCIBLE_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CRUCIBLE_AVX2_CLONES
#endif

namespace crucible::data::cv4 {
namespace {

constexpr int kResizeBits = 11, kResizeOne = 1 << kResizeBits;  // INTER_RESIZE_COEF_BITS
constexpr int kInterBits = 5, kInterTab = 1 << kInterBits;      // INTER_BITS: 1/32 pixel
constexpr int kAbBits = 10, kAbScale = 1 << kAbBits;            // warpAffine's AB_BITS
constexpr int kRemapBits = 15;                                  // INTER_REMAP_COEF_BITS

// saturate_cast<int>(double) and saturate_cast<short>(float): cvRound, half to even.
int cv_round(double v) { return static_cast<int>(std::nearbyint(v)); }
int cv_round(float v) { return static_cast<int>(std::nearbyintf(v)); }

// One axis of resize's INTER_LINEAR: the first source index and the two 11-bit weights of each
// output index. OpenCV clamps the x axis here (an index off the image takes the edge with weight
// 1) but not the y axis, whose rows are clamped when read with their weights kept.
struct Axis {
  std::vector<int> index;
  std::vector<int> w0, w1;
};
Axis linear_axis(int src, int dst, bool clamp) {
  const double scale = 1. / (static_cast<double>(dst) / src);
  Axis a;
  for (int d = 0; d < dst; ++d) {
    float f = static_cast<float>((d + 0.5) * scale - 0.5);
    int s = static_cast<int>(std::floor(f));
    f -= static_cast<float>(s);
    if (clamp && s < 0) f = 0, s = 0;
    if (clamp && s >= src - 1) f = 0, s = src - 1;
    a.index.push_back(s);
    a.w0.push_back(cv_round((1.f - f) * static_cast<float>(kResizeOne)));
    a.w1.push_back(cv_round(f * static_cast<float>(kResizeOne)));
  }
  return a;
}

// INTER_AREA's fast path for an exact downscale by 2: OpenCV takes it for INTER_LINEAR too.
void resize_half(const uint8_t* src, int src_w, int channels, uint8_t* dst, int dst_w, int dst_h) {
  const size_t row = static_cast<size_t>(src_w) * channels;
  for (int y = 0; y < dst_h; ++y) {
    const uint8_t* s0 = src + 2 * y * row;
    const uint8_t* s1 = s0 + row;
    uint8_t* d = dst + static_cast<size_t>(y) * dst_w * channels;
    for (int x = 0; x < dst_w; ++x) {
      for (int c = 0; c < channels; ++c) {
        const size_t i = static_cast<size_t>(2 * x) * channels + c;
        d[x * channels + c] = static_cast<uint8_t>((s0[i] + s0[i + channels] + s1[i] + s1[i + channels] + 2) >> 2);
      }
    }
  }
}

// VResizeLinear<uchar, int, short, FixedPtCast<int, uchar, 22>, VResizeLinearVec_32s8u>: each
// product shifted down apart, as OpenCV's vector code does.
CRUCIBLE_AVX2_CLONES void vertical_linear(const int* s0, const int* s1, int b0, int b1,
                                                                        uint8_t* d, size_t n) {
  for (size_t x = 0; x < n; ++x) {
    d[x] = static_cast<uint8_t>((((b0 * (s0[x] >> 4)) >> 16) + ((b1 * (s1[x] >> 4)) >> 16) + 2) >> 2);
  }
}

// BilinearTab_i: (1 - fy, fy) × (1 - fx, fx) × 2^15 for fx, fy in 32nds, exact (no correction needed).
struct BilinearTable {
  int w[kInterTab * kInterTab][4];
  BilinearTable() {
    for (int fy = 0; fy < kInterTab; ++fy) {
      for (int fx = 0; fx < kInterTab; ++fx) {
        int* t = w[fy * kInterTab + fx];
        t[0] = (kInterTab - fy) * (kInterTab - fx) * 32, t[1] = (kInterTab - fy) * fx * 32;
        t[2] = fy * (kInterTab - fx) * 32, t[3] = fy * fx * 32;
      }
    }
  }
};
const BilinearTable kBilinear;

}  // namespace

void resize_linear(const uint8_t* src, int src_w, int src_h, int channels, uint8_t* dst, int dst_w, int dst_h) {
  if (src_w < 1 || src_h < 1 || dst_w < 1 || dst_h < 1) {
    throw bad_input("cv2.resize from {}x{} to {}x{}: expected sizes of at least 1", src_w, src_h, dst_w, dst_h);
  }
  if (src_w == dst_w && src_h == dst_h) {  // cv::resize copies
    std::memcpy(dst, src, static_cast<size_t>(src_w) * src_h * channels);
    return;
  }
  const double scale_x = 1. / (static_cast<double>(dst_w) / src_w), scale_y = 1. / (static_cast<double>(dst_h) / src_h);
  if (std::abs(scale_x - 2) < DBL_EPSILON && std::abs(scale_y - 2) < DBL_EPSILON) {
    resize_half(src, src_w, channels, dst, dst_w, dst_h);
    return;
  }
  const Axis ax = linear_axis(src_w, dst_w, true), ay = linear_axis(src_h, dst_h, false);
  // The horizontal pass (HResizeLinear, in int): each output pixel's two source pixels and weights.
  const size_t n = static_cast<size_t>(dst_w) * channels;
  std::vector<int> ofs0(dst_w), ofs1(dst_w);
  for (int x = 0; x < dst_w; ++x) {
    ofs0[x] = ax.index[x] * channels;
    ofs1[x] = std::min(ax.index[x] + 1, src_w - 1) * channels;
  }
  // Each source row's pass once, when an output row first needs it.
  std::unique_ptr<int[]> rows(new int[static_cast<size_t>(src_h) * n]);
  std::vector<uint8_t> done(src_h, 0);
  auto row = [&](int y) -> const int* {
    int* d = &rows[y * n];
    if (done[y] == 0) {
      const uint8_t* s = src + static_cast<size_t>(y) * src_w * channels;
      if (channels == 3) {
        for (int x = 0; x < dst_w; ++x) {
          const uint8_t *p0 = s + ofs0[x], *p1 = s + ofs1[x];
          const int a = ax.w0[x], b = ax.w1[x];
          d[3 * x] = p0[0] * a + p1[0] * b, d[3 * x + 1] = p0[1] * a + p1[1] * b, d[3 * x + 2] = p0[2] * a + p1[2] * b;
        }
      } else {
        for (int x = 0; x < dst_w; ++x) {
          for (int c = 0; c < channels; ++c) d[x * channels + c] = s[ofs0[x] + c] * ax.w0[x] + s[ofs1[x] + c] * ax.w1[x];
        }
      }
      done[y] = 1;
    }
    return d;
  };
  for (int y = 0; y < dst_h; ++y) {
    const int* s0 = row(std::clamp(ay.index[y], 0, src_h - 1));
    const int* s1 = row(std::clamp(ay.index[y] + 1, 0, src_h - 1));
    vertical_linear(s0, s1, ay.w0[y], ay.w1[y], dst + y * n, n);
  }
}

void warp_affine(const uint8_t* src, int src_w, int src_h, uint8_t* dst, int dst_w, int dst_h, const double m[6],
                 const uint8_t border[3]) {
  // warpAffine inverts M (no WARP_INVERSE_MAP), in double.
  double a[6] = {m[0], m[1], m[2], m[3], m[4], m[5]};
  double det = a[0] * a[4] - a[1] * a[3];
  det = det != 0 ? 1. / det : 0;
  const double a11 = a[4] * det, a22 = a[0] * det;
  a[0] = a11, a[1] *= -det, a[3] *= -det, a[4] = a22;
  const double b1 = -a[0] * a[2] - a[1] * a[5], b2 = -a[3] * a[2] - a[4] * a[5];
  a[2] = b1, a[5] = b2;
  std::vector<int> adelta(dst_w), bdelta(dst_w);
  for (int x = 0; x < dst_w; ++x) {
    adelta[x] = cv_round(a[0] * x * kAbScale);
    bdelta[x] = cv_round(a[3] * x * kAbScale);
  }
  const int round_delta = kAbScale / kInterTab / 2;
  for (int y = 0; y < dst_h; ++y) {
    const int x0 = cv_round((a[1] * y + a[2]) * kAbScale) + round_delta;
    const int y0 = cv_round((a[4] * y + a[5]) * kAbScale) + round_delta;
    uint8_t* d = dst + static_cast<size_t>(y) * dst_w * 3;
    for (int x = 0; x < dst_w; ++x, d += 3) {
      const int X = (x0 + adelta[x]) >> (kAbBits - kInterBits), Y = (y0 + bdelta[x]) >> (kAbBits - kInterBits);
      // The map is stored as shorts (saturate_cast<short>), the fraction as a table index.
      const int sx = std::clamp(X >> kInterBits, -32768, 32767), sy = std::clamp(Y >> kInterBits, -32768, 32767);
      const int* w = kBilinear.w[((Y & (kInterTab - 1)) << kInterBits) | (X & (kInterTab - 1))];
      if (static_cast<unsigned>(sx) < static_cast<unsigned>(src_w - 1) && static_cast<unsigned>(sy) < static_cast<unsigned>(src_h - 1)) {
        const uint8_t* p = src + (static_cast<size_t>(sy) * src_w + sx) * 3;
        const uint8_t* q = p + static_cast<size_t>(src_w) * 3;
        for (int c = 0; c < 3; ++c) {
          d[c] = static_cast<uint8_t>((p[c] * w[0] + p[c + 3] * w[1] + q[c] * w[2] + q[c + 3] * w[3] + (1 << (kRemapBits - 1))) >>
                                      kRemapBits);
        }
        continue;
      }
      if (sx >= src_w || sx + 1 < 0 || sy >= src_h || sy + 1 < 0) {  // remapBilinear: all four taps outside
        d[0] = border[0], d[1] = border[1], d[2] = border[2];
        continue;
      }
      const uint8_t* taps[4];
      for (int k = 0; k < 4; ++k) {
        const int tx = sx + (k & 1), ty = sy + (k >> 1);
        taps[k] = tx >= 0 && tx < src_w && ty >= 0 && ty < src_h ? src + (static_cast<size_t>(ty) * src_w + tx) * 3 : border;
      }
      for (int c = 0; c < 3; ++c) {
        const int v = taps[0][c] * w[0] + taps[1][c] * w[1] + taps[2][c] * w[2] + taps[3][c] * w[3];
        d[c] = static_cast<uint8_t>((v + (1 << (kRemapBits - 1))) >> kRemapBits);
      }
    }
  }
}

namespace {

// RGB2HSV_b's tables (hsv_shift 12, hrange 180).
struct HsvTables {
  int sdiv[256], hdiv[256];
  HsvTables() {
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; ++i) {
      sdiv[i] = cv_round((255 << 12) / (1. * i));
      hdiv[i] = cv_round((180 << 12) / (6. * i));
    }
  }
};

// HSV2RGB_b's factors for each (H, S), in float as OpenCV computes them, already in R, G, B order:
// with h the hue's fraction in its sector, each channel's factor is 1, 1 - s, 1 - s h or
// 1 - s (1 - h) (the last two fused, as OpenCV's AVX-512 build computes them) by the sector's
// sector_data; a level is then float(float(v × factor) × 255) with v = V / 255.
struct HsvFactors {
  float f[180 * 256][3];
  HsvFactors() {
    // sector_data ({1,3,0}, {1,0,2}, {3,0,1}, {0,2,1}, {0,1,3}, {2,1,0} for B, G, R), for R, G, B.
    constexpr int kSectorRgb[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
    const float hscale = 6.0f / 180.0f;
    for (int H = 0; H < 180; ++H) {
      for (int S = 0; S < 256; ++S) {
        const float s = static_cast<float>(S) * (1.0f / 255.0f);
        float h = static_cast<float>(H) * hscale;
        const float sector = std::trunc(h);
        h -= sector;
        const float tab[4] = {1.f, 1.f - s, std::fmaf(-s, h, 1.f), std::fmaf(-s, 1.f - h, 1.f)};
        for (int c = 0; c < 3; ++c) f[H * 256 + S][c] = tab[kSectorRgb[static_cast<int>(sector)][c]];
      }
    }
  }
};

constexpr int kHsvBlock = 64;  // pixels per SIMD step of OpenCV's AVX-512 HSV2RGB_b (4 × 16 lanes)

// cvRound of a level in [0, 2^22): adding and taking away 2^23 rounds it half to even.
inline int round_level(float v) {
  volatile float big = 8388608.f;  // volatile: the addition must happen in float, at run time
  return static_cast<int>((v + big) - big);
}

}  // namespace

void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int width, int height) {
  static const HsvTables t;
  const size_t n = static_cast<size_t>(width) * height;
  for (size_t i = 0; i < n; ++i) {
    // Channel order: red is rgb[0] here where BGR data has it at [2].
    const int r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
    const int v = std::max({r, g, b}), vmin = std::min({r, g, b}), diff = v - vmin;
    const int vr = v == r ? -1 : 0, vg = v == g ? -1 : 0;
    const int s = (diff * t.sdiv[v] + (1 << 11)) >> 12;
    int h = (vr & (g - b)) + (~vr & ((vg & (b - r + 2 * diff)) + ((~vg) & (r - g + 4 * diff))));
    h = (h * t.hdiv[diff] + (1 << 11)) >> 12;
    h += h < 0 ? 180 : 0;
    hsv[3 * i] = static_cast<uint8_t>(h), hsv[3 * i + 1] = static_cast<uint8_t>(s), hsv[3 * i + 2] = static_cast<uint8_t>(v);
  }
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int width, int height) {
  static const HsvFactors t;
  const int simd_end = width - width % kHsvBlock;  // the blocks OpenCV's vector loop takes
  for (int y = 0; y < height; ++y) {
    const uint8_t* in = hsv + static_cast<size_t>(y) * width * 3;
    uint8_t* out = rgb + static_cast<size_t>(y) * width * 3;
    for (int x = 0; x < width; ++x, in += 3, out += 3) {
      if (in[0] >= 180) throw bad_input("HSV to RGB: hue {} past 179", in[0]);
      const float* f = t.f[in[0] * 256 + in[1]];
      const float v = static_cast<float>(in[2]) * (1.0f / 255.0f);
      for (int c = 0; c < 3; ++c) {
        const float level = (v * f[c]) * 255.0f;  // in [0, 255]
        // The vector loop truncates (v_trunc); the scalar tail rounds (saturate_cast).
        out[c] = static_cast<uint8_t>(x < simd_end ? static_cast<int>(level) : round_level(level));
      }
    }
  }
}

}  // namespace crucible::data::cv4
