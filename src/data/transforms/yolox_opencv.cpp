// OpenCV 4.x's uint8 arithmetic that YOLOX's pipeline runs (see yolox.h, namespace cv4): resize
// INTER_LINEAR, warpAffine INTER_LINEAR with a constant border, and the uint8 HSV conversions,
// each written after OpenCV's imgproc (resize.cpp, imgwarp.cpp, color_hsv.simd.hpp) and held to
// cv2 byte for byte by tests/python/test_detection_yolox.py. Compiled with -ffp-contract=off:
// every fused multiply-add below is OpenCV's (its AVX-512 build fuses 1 - s*h), written as fmaf.
// Hand-written: Debian's libopencv-imgproc would do these, at the price of OpenCV in the data layer
// and pixels that follow its CPU dispatch (docs/DESIGN.md, Dependencies: a decision left open).
#include <algorithm>
#include <array>
#include <atomic>
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

// The AVX2 loops (8 pixels a step, the same integer and float operations as the scalar ones):
// functions compiled for AVX2 by attribute and picked at run time, so the rest of the file, and
// any CPU without AVX2, keeps the scalar code. Gathers read 4 bytes where a loop needs 1 to 3:
// each loop leaves to the scalar code the last pixels whose read would pass the buffer's end.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CRUCIBLE_CV4_AVX2 1
#define CRUCIBLE_TARGET_AVX2 __attribute__((target("avx2")))
#define CRUCIBLE_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#endif

namespace crucible::data::cv4 {
namespace {

std::atomic<bool> g_vector_loops{true};

bool vector_loops() {
#ifdef CRUCIBLE_CV4_AVX2
  static const bool cpu = __builtin_cpu_supports("avx2");
  return cpu && g_vector_loops.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// HSV2RGB_b's vector loop fuses 1 - s·h as OpenCV's AVX-512 build does.
bool fma_cpu() {
#ifdef CRUCIBLE_CV4_AVX2
  static const bool cpu = __builtin_cpu_supports("fma");
  return cpu;
#else
  return false;
#endif
}

#ifdef CRUCIBLE_CV4_AVX2
// 8 pixels' channels (each an int32 lane in [0, 255]) written as 24 interleaved bytes.
CRUCIBLE_TARGET_AVX2 inline void store_rgb8(uint8_t* d, __m256i c0, __m256i c1, __m256i c2) {
  const __m256i px = _mm256_or_si256(c0, _mm256_or_si256(_mm256_slli_epi32(c1, 8), _mm256_slli_epi32(c2, 16)));
  const __m256i pick = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  alignas(32) uint8_t tmp[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm256_shuffle_epi8(px, pick));
  std::memcpy(d, tmp, 12);
  std::memcpy(d + 12, tmp + 16, 12);
}

// 8 lanes of 4 bytes from `base` + each lane's byte offset.
CRUCIBLE_TARGET_AVX2 inline __m256i gather4(const uint8_t* base, __m256i offsets) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), offsets, 1);
}
#endif

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
// product shifted down apart, as OpenCV's vector code does. The rows hold the horizontal sums
// already shifted down by 4 (S >> 4 < 2^15: what the formula reads of them), as int16.
CRUCIBLE_AVX2_CLONES void vertical_linear_scalar(const int16_t* s0, const int16_t* s1, int b0, int b1, uint8_t* d,
                                                 size_t n) {
  for (size_t x = 0; x < n; ++x) d[x] = static_cast<uint8_t>((((b0 * s0[x]) >> 16) + ((b1 * s1[x]) >> 16) + 2) >> 2);
}

#ifdef CRUCIBLE_CV4_AVX2
// The same 16 values a step: (b · s) >> 16 is the high half of a 16-bit product (both factors
// are below 2^15 and not negative), as OpenCV computes it. Returns the values done.
CRUCIBLE_TARGET_AVX2 size_t vertical_linear_avx2(const int16_t* s0, const int16_t* s1, int b0, int b1, uint8_t* d,
                                                 size_t n) {
  const __m256i w0 = _mm256_set1_epi16(static_cast<int16_t>(b0)), w1 = _mm256_set1_epi16(static_cast<int16_t>(b1));
  const __m256i two = _mm256_set1_epi16(2);
  size_t x = 0;
  for (; x + 16 <= n; x += 16) {
    const __m256i a = _mm256_mulhi_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s0 + x)), w0);
    const __m256i b = _mm256_mulhi_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s1 + x)), w1);
    const __m256i v = _mm256_srai_epi16(_mm256_add_epi16(_mm256_add_epi16(a, b), two), 2);
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(v, v), 0x08);  // lanes 0 and 2
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + x), _mm256_castsi256_si128(bytes));
  }
  return x;
}

// HResizeLinear's sums for output pixels [0, pixels) of a 3-channel row, shifted down by 4 as
// the vertical pass reads them: each pixel's two source pixels (4 bytes read, 3 used)
// interleaved as 16-bit pairs and multiplied by its weight pair (w0 | w1 << 16) in one madd.
// Writes 4 values a pixel, the 4th overwritten by the next pixel's (the caller keeps room for
// one after the row).
CRUCIBLE_TARGET_AVX2 void horizontal_linear3_avx2(const uint8_t* s, const int* ofs0, const int* ofs1, const int* weights,
                                                  int16_t* d, int pixels) {
  for (int x = 0; x < pixels; ++x) {
    uint32_t a, b;
    std::memcpy(&a, s + ofs0[x], 4);
    std::memcpy(&b, s + ofs1[x], 4);
    const __m128i pairs = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(static_cast<int>(a)),
                                                              _mm_cvtsi32_si128(static_cast<int>(b))));
    const __m128i sums = _mm_srai_epi32(_mm_madd_epi16(pairs, _mm_set1_epi32(weights[x])), 4);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d + 3 * x), _mm_packs_epi32(sums, sums));
  }
}
#endif

void vertical_linear(const int16_t* s0, const int16_t* s1, int b0, int b1, uint8_t* d, size_t n, bool vector) {
  size_t x = 0;
#ifdef CRUCIBLE_CV4_AVX2
  if (vector) x = vertical_linear_avx2(s0, s1, b0, b1, d, n);
#endif
  vertical_linear_scalar(s0 + x, s1 + x, b0, b1, d + x, n - x);
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
  // The horizontal pass (HResizeLinear, in int), element by element: each output channel value's
  // two source bytes (offsets in the row) and weights.
  const size_t n = static_cast<size_t>(dst_w) * channels;
  const size_t row_bytes = static_cast<size_t>(src_w) * channels;
  std::vector<int> o0(n), o1(n), w0(n), w1(n);
  for (int x = 0; x < dst_w; ++x) {
    for (int c = 0; c < channels; ++c) {
      const size_t k = static_cast<size_t>(x) * channels + c;
      o0[k] = ax.index[x] * channels + c;
      o1[k] = std::min(ax.index[x] + 1, src_w - 1) * channels + c;
      w0[k] = ax.w0[x], w1[k] = ax.w1[x];
    }
  }
  // The vector loop (3 channels): the output pixels whose 4-byte reads stay inside the source
  // row, a prefix; each pixel's weights as one int of two 16-bit halves.
  int vector_pixels = 0;
  std::vector<int> ofs0, ofs1, pair;
  if (channels == 3 && vector_loops()) {
    while (vector_pixels < dst_w &&
           static_cast<size_t>(std::max(o0[3 * vector_pixels], o1[3 * vector_pixels])) + 4 <= row_bytes) {
      ++vector_pixels;
    }
    for (int x = 0; x < vector_pixels; ++x) {
      ofs0.push_back(o0[3 * x]), ofs1.push_back(o1[3 * x]);
      pair.push_back(static_cast<int>(static_cast<uint32_t>(ax.w0[x]) | static_cast<uint32_t>(ax.w1[x]) << 16));
    }
  }
  // Each source row's pass once, when an output row first needs it (each row with room after it
  // for the vector loop's 4-value stores). Held as S >> 4, all the vertical pass reads of a sum.
  const size_t stride = n + 1;
  std::unique_ptr<int16_t[]> rows(new int16_t[static_cast<size_t>(src_h) * stride]);
  std::vector<uint8_t> done(src_h, 0);
  auto row = [&](int y) -> const int16_t* {
    int16_t* d = &rows[y * stride];
    if (done[y] == 0) {
      const uint8_t* s = src + static_cast<size_t>(y) * row_bytes;
      size_t k = 0;
#ifdef CRUCIBLE_CV4_AVX2
      if (vector_pixels > 0) {
        horizontal_linear3_avx2(s, ofs0.data(), ofs1.data(), pair.data(), d, vector_pixels);
        k = static_cast<size_t>(vector_pixels) * 3;
      }
#endif
      for (; k < n; ++k) d[k] = static_cast<int16_t>((s[o0[k]] * w0[k] + s[o1[k]] * w1[k]) >> 4);
      done[y] = 1;
    }
    return d;
  };
  const bool vector = vector_loops();
  for (int y = 0; y < dst_h; ++y) {
    const int16_t* s0 = row(std::clamp(ay.index[y], 0, src_h - 1));
    const int16_t* s1 = row(std::clamp(ay.index[y] + 1, 0, src_h - 1));
    vertical_linear(s0, s1, ay.w0[y], ay.w1[y], dst + y * n, n, vector);
  }
}

namespace {

// One row of warpAffine's output: the source, the row's fixed-point start and each column's step.
struct WarpRow {
  const uint8_t* src;
  int src_w, src_h;
  const int *adelta, *bdelta;
  int x0, y0;
  const uint8_t* border;
};

// Output pixel x of the row (remapBilinear, 3 channels).
inline void warp_pixel(const WarpRow& r, int x, uint8_t* d) {
  const int X = (r.x0 + r.adelta[x]) >> (kAbBits - kInterBits), Y = (r.y0 + r.bdelta[x]) >> (kAbBits - kInterBits);
  // The map is stored as shorts (saturate_cast<short>), the fraction as a table index.
  const int sx = std::clamp(X >> kInterBits, -32768, 32767), sy = std::clamp(Y >> kInterBits, -32768, 32767);
  const int* w = kBilinear.w[((Y & (kInterTab - 1)) << kInterBits) | (X & (kInterTab - 1))];
  const int src_w = r.src_w, src_h = r.src_h;
  if (static_cast<unsigned>(sx) < static_cast<unsigned>(src_w - 1) && static_cast<unsigned>(sy) < static_cast<unsigned>(src_h - 1)) {
    const uint8_t* p = r.src + (static_cast<size_t>(sy) * src_w + sx) * 3;
    const uint8_t* q = p + static_cast<size_t>(src_w) * 3;
    for (int c = 0; c < 3; ++c) {
      d[c] = static_cast<uint8_t>((p[c] * w[0] + p[c + 3] * w[1] + q[c] * w[2] + q[c + 3] * w[3] + (1 << (kRemapBits - 1))) >>
                                  kRemapBits);
    }
    return;
  }
  if (sx >= src_w || sx + 1 < 0 || sy >= src_h || sy + 1 < 0) {  // remapBilinear: all four taps outside
    d[0] = r.border[0], d[1] = r.border[1], d[2] = r.border[2];
    return;
  }
  const uint8_t* taps[4];
  for (int k = 0; k < 4; ++k) {
    const int tx = sx + (k & 1), ty = sy + (k >> 1);
    taps[k] = tx >= 0 && tx < src_w && ty >= 0 && ty < src_h ? r.src + (static_cast<size_t>(ty) * src_w + tx) * 3 : r.border;
  }
  for (int c = 0; c < 3; ++c) {
    const int v = taps[0][c] * w[0] + taps[1][c] * w[1] + taps[2][c] * w[2] + taps[3][c] * w[3];
    d[c] = static_cast<uint8_t>((v + (1 << (kRemapBits - 1))) >> kRemapBits);
  }
}

#ifdef CRUCIBLE_CV4_AVX2
// The row 8 pixels a step: a step whose 8 source squares are all inside the image in vector
// registers (the taps' reads end inside the square's pixels), any other by warp_pixel. Returns
// the pixels done (the rest of the row is the caller's).
CRUCIBLE_TARGET_AVX2 int warp_row_avx2(const WarpRow& r, int dst_w, uint8_t* d) {
  const __m256i x0 = _mm256_set1_epi32(r.x0), y0 = _mm256_set1_epi32(r.y0);
  const __m256i last_x = _mm256_set1_epi32(r.src_w - 1), last_y = _mm256_set1_epi32(r.src_h - 1);
  const __m256i minus1 = _mm256_set1_epi32(-1), lo = _mm256_set1_epi32(-32768), hi = _mm256_set1_epi32(32767);
  const __m256i width = _mm256_set1_epi32(r.src_w), row3 = _mm256_set1_epi32(r.src_w * 3);
  const __m256i frac = _mm256_set1_epi32(kInterTab - 1), tab = _mm256_set1_epi32(kInterTab);
  const __m256i ff = _mm256_set1_epi32(0xff), half = _mm256_set1_epi32(1 << (kRemapBits - 1));
  int x = 0;
  for (; x + 8 <= dst_w; x += 8) {
    const __m256i X = _mm256_srai_epi32(
        _mm256_add_epi32(x0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.adelta + x))), kAbBits - kInterBits);
    const __m256i Y = _mm256_srai_epi32(
        _mm256_add_epi32(y0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.bdelta + x))), kAbBits - kInterBits);
    const __m256i sx = _mm256_max_epi32(_mm256_min_epi32(_mm256_srai_epi32(X, kInterBits), hi), lo);
    const __m256i sy = _mm256_max_epi32(_mm256_min_epi32(_mm256_srai_epi32(Y, kInterBits), hi), lo);
    const __m256i inside = _mm256_and_si256(
        _mm256_and_si256(_mm256_cmpgt_epi32(sx, minus1), _mm256_cmpgt_epi32(last_x, sx)),
        _mm256_and_si256(_mm256_cmpgt_epi32(sy, minus1), _mm256_cmpgt_epi32(last_y, sy)));
    if (_mm256_movemask_ps(_mm256_castsi256_ps(inside)) != 0xff) {
      for (int k = 0; k < 8; ++k) warp_pixel(r, x + k, d + 3 * (x + k));
      continue;
    }
    // BilinearTab_i's four weights, from the fractions.
    const __m256i fx = _mm256_and_si256(X, frac), fy = _mm256_and_si256(Y, frac);
    const __m256i gx = _mm256_sub_epi32(tab, fx), gy = _mm256_sub_epi32(tab, fy);
    const __m256i w0 = _mm256_slli_epi32(_mm256_mullo_epi32(gy, gx), 5), w1 = _mm256_slli_epi32(_mm256_mullo_epi32(gy, fx), 5);
    const __m256i w2 = _mm256_slli_epi32(_mm256_mullo_epi32(fy, gx), 5), w3 = _mm256_slli_epi32(_mm256_mullo_epi32(fy, fx), 5);
    __m256i off = _mm256_add_epi32(_mm256_mullo_epi32(sy, width), sx);
    off = _mm256_add_epi32(off, _mm256_slli_epi32(off, 1));  // × 3
    const __m256i two = _mm256_set1_epi32(2);
    // p: the square's top-left pixel (its bytes 0–2); p1: from its last byte, the next pixel (bytes 1–3).
    const __m256i p = gather4(r.src, off), p1 = _mm256_srli_epi32(gather4(r.src, _mm256_add_epi32(off, two)), 8);
    const __m256i below = _mm256_add_epi32(off, row3);
    const __m256i q = gather4(r.src, below), q1 = _mm256_srli_epi32(gather4(r.src, _mm256_add_epi32(below, two)), 8);
    __m256i out[3];
    for (int c = 0; c < 3; ++c) {
      const __m128i sh = _mm_cvtsi32_si128(8 * c);
      const __m256i pc = _mm256_and_si256(_mm256_srl_epi32(p, sh), ff), p1c = _mm256_and_si256(_mm256_srl_epi32(p1, sh), ff);
      const __m256i qc = _mm256_and_si256(_mm256_srl_epi32(q, sh), ff), q1c = _mm256_and_si256(_mm256_srl_epi32(q1, sh), ff);
      const __m256i v = _mm256_add_epi32(_mm256_add_epi32(_mm256_mullo_epi32(pc, w0), _mm256_mullo_epi32(p1c, w1)),
                                         _mm256_add_epi32(_mm256_mullo_epi32(qc, w2), _mm256_mullo_epi32(q1c, w3)));
      out[c] = _mm256_srli_epi32(_mm256_add_epi32(v, half), kRemapBits);
    }
    store_rgb8(d + 3 * x, out[0], out[1], out[2]);
  }
  return x;
}
#endif

}  // namespace

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
  // The vector loop's byte offsets are int32: an image of 2^31 bytes or more takes the scalar one.
  [[maybe_unused]] const bool vector = vector_loops() && static_cast<int64_t>(src_w) * src_h * 3 < (int64_t{1} << 31) - 8;
  for (int y = 0; y < dst_h; ++y) {
    WarpRow r{src, src_w, src_h, adelta.data(), bdelta.data(), cv_round((a[1] * y + a[2]) * kAbScale) + round_delta,
              cv_round((a[4] * y + a[5]) * kAbScale) + round_delta, border};
    uint8_t* d = dst + static_cast<size_t>(y) * dst_w * 3;
    int x = 0;
#ifdef CRUCIBLE_CV4_AVX2
    if (vector) x = warp_row_avx2(r, dst_w, d);
#endif
    for (; x < dst_w; ++x) warp_pixel(r, x, d + 3 * x);
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

namespace {

#ifdef CRUCIBLE_CV4_AVX2
// RGB2HSV_b of 8 pixels read as 4-byte lanes (R, G, B, anything): H, S and V as int32 lanes.
CRUCIBLE_TARGET_AVX2 inline void hsv8(__m256i px, const HsvTables& t, __m256i* H, __m256i* S, __m256i* V) {
  const __m256i ff = _mm256_set1_epi32(0xff), round = _mm256_set1_epi32(1 << 11), zero = _mm256_setzero_si256();
  const __m256i r = _mm256_and_si256(px, ff), g = _mm256_and_si256(_mm256_srli_epi32(px, 8), ff);
  const __m256i b = _mm256_and_si256(_mm256_srli_epi32(px, 16), ff);
  const __m256i v = _mm256_max_epi32(r, _mm256_max_epi32(g, b)), vmin = _mm256_min_epi32(r, _mm256_min_epi32(g, b));
  const __m256i diff = _mm256_sub_epi32(v, vmin);
  const __m256i vr = _mm256_cmpeq_epi32(v, r), vg = _mm256_cmpeq_epi32(v, g);
  const __m256i sdiv = _mm256_i32gather_epi32(t.sdiv, v, 4), hdiv = _mm256_i32gather_epi32(t.hdiv, diff, 4);
  const __m256i sat = _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(diff, sdiv), round), 12);
  const __m256i if_g = _mm256_add_epi32(_mm256_sub_epi32(b, r), _mm256_slli_epi32(diff, 1));
  const __m256i if_b = _mm256_add_epi32(_mm256_sub_epi32(r, g), _mm256_slli_epi32(diff, 2));
  const __m256i not_r = _mm256_add_epi32(_mm256_and_si256(vg, if_g), _mm256_andnot_si256(vg, if_b));
  __m256i h = _mm256_add_epi32(_mm256_and_si256(vr, _mm256_sub_epi32(g, b)), _mm256_andnot_si256(vr, not_r));
  h = _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(h, hdiv), round), 12);
  *H = _mm256_add_epi32(h, _mm256_and_si256(_mm256_cmpgt_epi32(zero, h), _mm256_set1_epi32(180)));
  *S = sat;
  *V = v;
}

// RGB2HSV_b for pixels [0, n) (n a multiple of 8; the caller keeps the 4-byte reads inside).
CRUCIBLE_TARGET_AVX2 void rgb_to_hsv_avx2(const uint8_t* rgb, uint8_t* hsv, size_t n, const HsvTables& t) {
  const __m256i lanes = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  for (size_t i = 0; i < n; i += 8) {
    __m256i h, s, v;
    hsv8(gather4(rgb + 3 * i, lanes), t, &h, &s, &v);
    store_rgb8(hsv + 3 * i, h, s, v);
  }
}

// HSV2RGB_b of 8 pixels (H < 180, S, V as int32 lanes): the factors as HsvFactors computes them
// (the same float operations, 1 - s·h fused), chosen by sector; `truncate`: the levels of
// OpenCV's vector blocks, else rounded half to even (its tail).
CRUCIBLE_TARGET_AVX2_FMA inline void rgb8(__m256i H, __m256i S, __m256i V, bool truncate, uint8_t* out) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(1.0f / 255.0f));
  __m256 h = _mm256_mul_ps(_mm256_cvtepi32_ps(H), _mm256_set1_ps(6.0f / 180.0f));
  const __m256 sector = _mm256_round_ps(h, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  h = _mm256_sub_ps(h, sector);
  const __m256 tab[4] = {one, _mm256_sub_ps(one, s), _mm256_fnmadd_ps(s, h, one),
                         _mm256_fnmadd_ps(s, _mm256_sub_ps(one, h), one)};
  const __m256i sec = _mm256_cvttps_epi32(sector);
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(V), _mm256_set1_ps(1.0f / 255.0f));
  // kSectorRgb by channel: which of tab[] each sector takes (sectors 6 and 7 never occur).
  const __m256i which[3] = {_mm256_setr_epi32(0, 2, 1, 1, 3, 0, 0, 0), _mm256_setr_epi32(3, 0, 0, 2, 1, 1, 0, 0),
                            _mm256_setr_epi32(1, 1, 3, 0, 0, 2, 0, 0)};
  __m256i level[3];
  for (int c = 0; c < 3; ++c) {
    const __m256i k = _mm256_permutevar8x32_epi32(which[c], sec);
    __m256 f = tab[0];
    for (int t = 1; t < 4; ++t) {
      f = _mm256_blendv_ps(f, tab[t], _mm256_castsi256_ps(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(t))));
    }
    const __m256 l = _mm256_mul_ps(_mm256_mul_ps(v, f), _mm256_set1_ps(255.0f));
    level[c] = truncate ? _mm256_cvttps_epi32(l) : _mm256_cvtps_epi32(l);  // the latter: MXCSR's half to even
  }
  store_rgb8(out, level[0], level[1], level[2]);
}

// HSV2RGB_b for pixels [x, x + 8) of a row: false when a hue is past 179 (the scalar loop names it).
CRUCIBLE_TARGET_AVX2_FMA bool hsv_to_rgb8_avx2(const uint8_t* in, uint8_t* out, bool truncate) {
  const __m256i ff = _mm256_set1_epi32(0xff);
  const __m256i px = gather4(in, _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21));
  const __m256i H = _mm256_and_si256(px, ff), S = _mm256_and_si256(_mm256_srli_epi32(px, 8), ff);
  const __m256i V = _mm256_and_si256(_mm256_srli_epi32(px, 16), ff);
  if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(H, _mm256_set1_epi32(179))) != 0) return false;
  rgb8(H, S, V, truncate, out);
  return true;
}

// YOLOX's HSV jitter of a row's pixels [0, end) in place, 8 a step (returns the pixels done): RGB
// to HSV, H + hue modulo 180 (hue in [0, 180)), S + ds and V + dv clipped, back to RGB.
CRUCIBLE_TARGET_AVX2_FMA int hsv_jitter_row_avx2(uint8_t* row, int end, int simd_end, int hue, int ds, int dv,
                                                 const HsvTables& t) {
  const __m256i lanes = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i dh = _mm256_set1_epi32(hue), h180 = _mm256_set1_epi32(180), h179 = _mm256_set1_epi32(179);
  const __m256i vs = _mm256_set1_epi32(ds), vv = _mm256_set1_epi32(dv);
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
  int x = 0;
  for (; x + 8 <= end; x += 8) {
    __m256i h, s, v;
    hsv8(gather4(row + 3 * x, lanes), t, &h, &s, &v);
    h = _mm256_add_epi32(h, dh);
    h = _mm256_sub_epi32(h, _mm256_and_si256(_mm256_cmpgt_epi32(h, h179), h180));
    s = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(s, vs), zero), top);
    v = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(v, vv), zero), top);
    rgb8(h, s, v, x < simd_end, row + 3 * x);
  }
  return x;
}
#endif

}  // namespace

namespace {

// RGB2HSV_b of one pixel. Channel order: red is rgb[0] here where BGR data has it at [2].
inline void hsv_of(const uint8_t* rgb, uint8_t* hsv, const HsvTables& t) {
  const int r = rgb[0], g = rgb[1], b = rgb[2];
  const int v = std::max({r, g, b}), vmin = std::min({r, g, b}), diff = v - vmin;
  const int vr = v == r ? -1 : 0, vg = v == g ? -1 : 0;
  const int s = (diff * t.sdiv[v] + (1 << 11)) >> 12;
  int h = (vr & (g - b)) + (~vr & ((vg & (b - r + 2 * diff)) + ((~vg) & (r - g + 4 * diff))));
  h = (h * t.hdiv[diff] + (1 << 11)) >> 12;
  h += h < 0 ? 180 : 0;
  hsv[0] = static_cast<uint8_t>(h), hsv[1] = static_cast<uint8_t>(s), hsv[2] = static_cast<uint8_t>(v);
}

// HSV2RGB_b of one pixel; `truncate` inside OpenCV's vector blocks, else rounded (its tail).
inline void rgb_of(const uint8_t* hsv, uint8_t* rgb, const HsvFactors& t, bool truncate) {
  if (hsv[0] >= 180) throw bad_input("HSV to RGB: hue {} past 179", hsv[0]);
  const float* f = t.f[hsv[0] * 256 + hsv[1]];
  const float v = static_cast<float>(hsv[2]) * (1.0f / 255.0f);
  for (int c = 0; c < 3; ++c) {
    const float level = (v * f[c]) * 255.0f;  // in [0, 255]
    // The vector loop truncates (v_trunc); the scalar tail rounds (saturate_cast).
    rgb[c] = static_cast<uint8_t>(truncate ? static_cast<int>(level) : round_level(level));
  }
}

}  // namespace

void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int width, int height) {
  static const HsvTables t;
  const size_t n = static_cast<size_t>(width) * height;
  size_t i = 0;
#ifdef CRUCIBLE_CV4_AVX2
  if (vector_loops() && n > 8) {  // each step reads one byte past its 8 pixels: the last pixel stays scalar
    i = (n - 1) / 8 * 8;
    rgb_to_hsv_avx2(rgb, hsv, i, t);
  }
#endif
  for (; i < n; ++i) hsv_of(rgb + 3 * i, hsv + 3 * i, t);
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int width, int height) {
  static const HsvFactors t;
  const int simd_end = width - width % kHsvBlock;  // the blocks OpenCV's vector loop takes
  [[maybe_unused]] const bool vector = vector_loops() && fma_cpu();
  for (int y = 0; y < height; ++y) {
    const uint8_t* in = hsv + static_cast<size_t>(y) * width * 3;
    uint8_t* out = rgb + static_cast<size_t>(y) * width * 3;
    int x = 0;
#ifdef CRUCIBLE_CV4_AVX2
    // Steps of 8 never straddle simd_end (a multiple of 64); the image's last pixel stays scalar
    // (a step reads one byte past its 8 pixels).
    const int steps_end = y + 1 < height ? width : width - 1;
    while (vector && x + 8 <= steps_end && hsv_to_rgb8_avx2(in + 3 * x, out + 3 * x, x < simd_end)) x += 8;
#endif
    for (; x < width; ++x) rgb_of(in + 3 * x, out + 3 * x, t, x < simd_end);
  }
}

void hsv_jitter(uint8_t* rgb, int width, int height, const std::array<int, 3>& gains) {
  static const HsvTables to_hsv;
  static const HsvFactors to_rgb;
  // YOLOX's shifts on H, S and V: H modulo 180 as numpy's % (the divisor's sign), S and V clipped.
  const int hue = (gains[0] % 180 + 180) % 180;
  uint8_t shift[3][256];
  for (int v = 0; v < 256; ++v) {
    shift[0][v] = static_cast<uint8_t>((v + hue) % 180);  // v < 180 for a hue
    shift[1][v] = static_cast<uint8_t>(std::clamp(v + gains[1], 0, 255));
    shift[2][v] = static_cast<uint8_t>(std::clamp(v + gains[2], 0, 255));
  }
  const int simd_end = width - width % kHsvBlock;
  [[maybe_unused]] const bool vector = vector_loops() && fma_cpu();
  for (int y = 0; y < height; ++y) {
    uint8_t* row = rgb + static_cast<size_t>(y) * width * 3;
    int x = 0;
#ifdef CRUCIBLE_CV4_AVX2
    // In place: a step reads its 8 pixels (and one byte of the next) before it writes them.
    const int steps_end = y + 1 < height ? width : width - 1;
    if (vector) x = hsv_jitter_row_avx2(row, steps_end, simd_end, hue, gains[1], gains[2], to_hsv);
#endif
    for (; x < width; ++x) {
      uint8_t hsv[3];
      hsv_of(row + 3 * x, hsv, to_hsv);
      hsv[0] = shift[0][hsv[0]], hsv[1] = shift[1][hsv[1]], hsv[2] = shift[2][hsv[2]];
      rgb_of(hsv, row + 3 * x, to_rgb, x < simd_end);
    }
  }
}

bool use_vector_loops(bool on) { return g_vector_loops.exchange(on); }

}  // namespace crucible::data::cv4
