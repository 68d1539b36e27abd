// Crop geometry and the resize kernel (hand-written: no Debian library resizes without
// per-size setup or its own threads, which would nest inside the loader's pool — D7).
#include "crucible/data/transforms/transform.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>


namespace crucible::data {

Rect random_resized_crop(int width, int height, SampleRng& rng, const RandomResizedCropOptions& o) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * rng.uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * rng.uniform());
    const int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = static_cast<int>(rng.next_u32() % static_cast<uint32_t>(height - h + 1));
      const int x = static_cast<int>(rng.next_u32() % static_cast<uint32_t>(width - w + 1));
      return Rect{x, y, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = static_cast<int>(std::lround(w / o.ratio_min));
  } else if (in_ratio > o.ratio_max) {
    w = static_cast<int>(std::lround(h * o.ratio_max));
  }
  return Rect{(width - w) / 2, (height - h) / 2, w, h};
}

Rect center_crop_region(int width, int height, double crop_fraction) {
  const int side = std::max(1, static_cast<int>(std::lround(std::min(width, height) * crop_fraction)));
  return Rect{(width - side) / 2, (height - side) / 2, side, side};
}

namespace {
// Python's int(round(margin / 2.0)) for margin >= 0: halves go to the even neighbour.
int half_to_even(int margin) {
  const int q = margin / 2;
  return (margin % 2 != 0 && q % 2 != 0) ? q + 1 : q;
}
}  // namespace

ResizeCentreCrop resize_centre_crop(int width, int height, int crop, double fraction) {
  return resize_centre_crop_to(width, height, static_cast<int>(crop / fraction), crop);  // Python's int(crop / fraction)
}

ResizeCentreCrop resize_centre_crop_to(int width, int height, int size, int crop) {
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height, long_side = portrait ? height : width;
  // int(size * long / short): an exact product, one correctly rounded division, truncated.
  const int other = static_cast<int>(static_cast<double>(size * long_side) / static_cast<double>(short_side));
  ResizeCentreCrop r;
  r.resized_width = portrait ? size : other;
  r.resized_height = portrait ? other : size;
  r.left = half_to_even(r.resized_width - crop);
  r.top = half_to_even(r.resized_height - crop);
  return r;
}

namespace {

// For each output index: the first input index and `taps` fixed-point weights of `bits` fraction
// bits (PIL's bilinear support, widened by the scale when shrinking so that it averages instead
// of aliasing); and the weights again in pairs, (w[2j], w[2j+1]) as two int16 in one int32, for
// pmaddwd. `bits` is torch's choice for its uint8 antialiased resize (UpSampleKernel.cpp,
// _compute_index_ranges_int16_weights): the most that keeps the largest weight below 2^14.
struct Coefficients {
  int taps = 0;
  int bits = 0;
  int pair_count = 0;  // ceil(taps / 2)
  std::vector<int> first;
  std::vector<int32_t> weights;  // [out][taps]
  std::vector<int32_t> pairs;    // [out][pair_count]
  std::vector<int32_t> pairs_t;  // the same, [pair_count][out]
};

Coefficients coefficients(int in, int out) {
  Coefficients c;
  const double scale = static_cast<double>(in) / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // bilinear support 1.0 × scale
  // Windows as PIL computes them; `taps` is the widest, so every output reads exactly `taps`
  // inputs from first[o] (zero weights pad) and the passes never index past the input.
  std::vector<int> lo(out), hi(out);
  int taps = 1;
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    lo[o] = std::max(0, static_cast<int>(center - support + 0.5));
    hi[o] = std::min(in, static_cast<int>(center + support + 0.5));
    taps = std::max(taps, hi[o] - lo[o]);
  }
  c.taps = std::min(taps, in);
  c.first.resize(out);
  c.weights.assign(static_cast<size_t>(out) * c.taps, 0);
  // The normalised weights in double, as PIL and torch compute them.
  std::vector<double> w(static_cast<size_t>(out) * c.taps, 0.0);
  double largest = 0;
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    double sum = 0;
    double* wo = &w[static_cast<size_t>(o) * c.taps];
    for (int i = lo[o]; i < hi[o]; ++i) {
      const double t = std::abs((i - center + 0.5) / filter_scale);
      wo[i - lo[o]] = t < 1.0 ? 1.0 - t : 0.0;
      sum += wo[i - lo[o]];
    }
    for (int i = lo[o]; i < hi[o]; ++i) {
      wo[i - lo[o]] = sum > 0 ? wo[i - lo[o]] / sum : 0.0;
      largest = std::max(largest, wo[i - lo[o]]);
    }
  }
  // torch: for (p = 0; p < 22; ++p) if ((int)(0.5 + largest · 2^(p+1)) >= 2^15) break.
  for (c.bits = 0; c.bits < 22; ++c.bits) {
    if (static_cast<int>(0.5 + largest * static_cast<double>(int64_t{1} << (c.bits + 1))) >= (1 << 15)) break;
  }
  for (int o = 0; o < out; ++o) {
    const int first = std::min(lo[o], in - c.taps);
    c.first[o] = first;
    int32_t* dst = &c.weights[static_cast<size_t>(o) * c.taps];
    const double* wo = &w[static_cast<size_t>(o) * c.taps];
    for (int i = lo[o]; i < hi[o]; ++i) {
      dst[i - first] = static_cast<int32_t>(0.5 + wo[i - lo[o]] * static_cast<double>(int64_t{1} << c.bits));
    }
  }
  // Each weight is below 2^14, so it fits an int16, and 255 · 2^22 sums within int32.
  c.pair_count = (c.taps + 1) / 2;
  c.pairs.assign(static_cast<size_t>(out) * c.pair_count, 0);
  for (int o = 0; o < out; ++o) {
    const int32_t* wo = &c.weights[static_cast<size_t>(o) * c.taps];
    for (int k = 0; k < c.taps; k += 2) {
      const uint32_t a = static_cast<uint32_t>(wo[k]);
      const uint32_t b = k + 1 < c.taps ? static_cast<uint32_t>(wo[k + 1]) : 0u;
      c.pairs[static_cast<size_t>(o) * c.pair_count + k / 2] = static_cast<int32_t>(a | (b << 16));
    }
  }
  c.pairs_t.resize(c.pairs.size());
  for (int o = 0; o < out; ++o) {
    for (int j = 0; j < c.pair_count; ++j) {
      c.pairs_t[static_cast<size_t>(j) * out + o] = c.pairs[static_cast<size_t>(o) * c.pair_count + j];
    }
  }
  return c;
}

__attribute__((always_inline)) inline uint8_t clamp8(int32_t v, int bits) {
  v = (v + (1 << (bits - 1))) >> bits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The vertical pass for one output row: out[i] = Σ_k w[k] · s0[k·stride + i], i < n.
void vertical_row(const uint8_t* s0, size_t stride, const int32_t* w, int taps, int bits, int n, int32_t* acc,
                  uint8_t* out) {
  {
    const int32_t w0 = w[0];
    for (int i = 0; i < n; ++i) acc[i] = w0 * s0[i];
  }
  for (int k = 1; k < taps; ++k) {
    const int32_t wk = w[k];
    if (wk == 0) continue;
    const uint8_t* s = s0 + static_cast<size_t>(k) * stride;
    for (int i = 0; i < n; ++i) acc[i] += wk * s[i];
  }
  for (int i = 0; i < n; ++i) out[i] = clamp8(acc[i], bits);
}

// The same with AVX2: 16 bytes at a time, two rows per pmaddwd, sums kept in registers across
// the taps; the same integer arithmetic, so the same bytes. Rows under 16 bytes go the portable way.
__attribute__((target("avx2"))) void vertical_row_avx2(const uint8_t* s0, size_t stride, const int32_t* w,
                                                       const int32_t* pairs, int taps, int bits, int n, int32_t* acc,
                                                       uint8_t* out) {
  if (n < 16) {
    vertical_row(s0, stride, w, taps, bits, n, acc, out);
    return;
  }
  const __m256i bias = _mm256_set1_epi32(1 << (bits - 1));
  const __m128i shift = _mm_cvtsi32_si128(bits);
  const __m256i zero = _mm256_setzero_si256();
  for (int i0 = 0; i0 < n; i0 += 16) {
    const int i = std::min(i0, n - 16);  // the last step overlaps the one before: same values
    __m256i lo = bias, hi = bias;
    const uint8_t* s = s0 + i;
    int k = 0;
    for (; k + 1 < taps; k += 2, s += 2 * stride) {
      const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + stride)));
      const __m256i wv = _mm256_set1_epi32(pairs[k / 2]);
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wv));
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wv));
    }
    if (k < taps) {  // the odd last row, paired with zeros (its pair's second weight is 0)
      const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m256i wv = _mm256_set1_epi32(pairs[k / 2]);
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, zero), wv));
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, zero), wv));
    }
    // Per 128-bit lane lo holds elements 0–3 (8–11), hi 4–7 (12–15): packing restores the order;
    // the saturating packs are clamp8's clamp.
    const __m256i words = _mm256_packs_epi32(_mm256_sra_epi32(lo, shift), _mm256_sra_epi32(hi, shift));
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(bytes));
  }
}

// Where output pixel x's channels go: interleaved [h, w, c] rows or planes [c, h, w].
struct RowOut {
  uint8_t* row;  // this output row (interleaved) or its row in plane 0
  size_t plane;  // bytes between planes; 0: interleaved
  int width;
  bool flip;
};

// One row of the horizontal pass for RGB with a tap count known at compile time (unrolled,
// weights in registers; kTaps = 0 handles any count), into three int32 rows of sums; then
// rounded and clamped a row at a time (this loop vectorises; per pixel it did not).
template <int kTaps>
__attribute__((always_inline)) inline void horizontal_rgb(const uint8_t* m, const Coefficients& cx, const RowOut& o,
                                                          int32_t* sums) {
  const int n = kTaps > 0 ? kTaps : cx.taps;
  const int w = o.width;
  for (int x = 0; x < w; ++x) {
    const int32_t* wx = &cx.weights[static_cast<size_t>(x) * n];
    const uint8_t* s = m + static_cast<size_t>(cx.first[x]) * 3;
    int32_t a[3] = {0, 0, 0};
    for (int k = 0; k < n; ++k) {
      const int32_t wk = wx[k];
      for (int c = 0; c < 3; ++c) a[c] += wk * s[3 * k + c];
    }
    const int xo = o.flip ? w - 1 - x : x;
    if (o.plane != 0) {
      for (int c = 0; c < 3; ++c) sums[c * w + xo] = a[c];
    } else {
      for (int c = 0; c < 3; ++c) sums[3 * xo + c] = a[c];
    }
  }
  if (o.plane != 0) {
    for (int c = 0; c < 3; ++c) {
      uint8_t* d = o.row + c * o.plane;
      for (int i = 0; i < w; ++i) d[i] = clamp8(sums[c * w + i], cx.bits);
    }
  } else {
    for (int i = 0; i < 3 * w; ++i) o.row[i] = clamp8(sums[i], cx.bits);
  }
}

void horizontal_rgb_any(const uint8_t* m, const Coefficients& cx, const RowOut& o, int32_t* sums) {
  switch (cx.taps) {
    case 2: horizontal_rgb<2>(m, cx, o, sums); break;
    case 3: horizontal_rgb<3>(m, cx, o, sums); break;
    case 4: horizontal_rgb<4>(m, cx, o, sums); break;
    case 5: horizontal_rgb<5>(m, cx, o, sums); break;
    default: horizontal_rgb<0>(m, cx, o, sums); break;
  }
}

// Byte shuffles that interleave eight pixels' planes, rg = (R0..R7, G0..G7) and b = (B0..B7, …),
// into R0 G0 B0 R1 …: output byte t is channel t % 3 of pixel t / 3; -1 leaves a zero.
struct InterleaveMasks {
  alignas(16) int8_t rg[2][16];
  alignas(16) int8_t b[2][16];
};
constexpr InterleaveMasks interleave_masks() {
  InterleaveMasks k{};
  for (int t = 0; t < 32; ++t) {
    const int p = t / 3, c = t % 3;
    const bool used = t < 24;
    k.rg[t / 16][t % 16] = static_cast<int8_t>(used && c == 0 ? p : used && c == 1 ? 8 + p : -1);
    k.b[t / 16][t % 16] = static_cast<int8_t>(used && c == 2 ? p : -1);
  }
  return k;
}
constexpr InterleaveMasks kInterleave = interleave_masks();

// Eight packed pixels of a row (low lane x, x+2, x+4, x+6, high lane the odd ones, as R, G, B, 0
// bytes) regrouped into planes, mirrored for a flip, stored as planes or interleaved.
__attribute__((target("avx2"))) inline void store8(const RowOut& o, __m256i bytes, int x) {
  const __m128i group = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m128i even = _mm_shuffle_epi8(_mm256_castsi256_si128(bytes), group);  // R0 R2 R4 R6 G0 … B6, 0…
  const __m128i odd = _mm_shuffle_epi8(_mm256_extracti128_si256(bytes, 1), group);
  __m128i rg = _mm_unpacklo_epi8(even, odd);  // R0 … R7 G0 … G7
  __m128i b = _mm_unpackhi_epi8(even, odd);   // B0 … B7, 0…
  if (o.flip) {
    const __m128i reverse = _mm_setr_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
    rg = _mm_shuffle_epi8(rg, reverse);
    b = _mm_shuffle_epi8(b, reverse);
  }
  const int xo = o.flip ? o.width - 8 - x : x;
  if (o.plane != 0) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o.row + xo), rg);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o.row + o.plane + xo), _mm_srli_si128(rg, 8));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o.row + 2 * o.plane + xo), b);
  } else {
    const auto mask = [](const int8_t* k) { return *reinterpret_cast<const __m128i*>(k); };
    const __m128i lo = _mm_or_si128(_mm_shuffle_epi8(rg, mask(kInterleave.rg[0])),
                                    _mm_shuffle_epi8(b, mask(kInterleave.b[0])));
    const __m128i hi = _mm_or_si128(_mm_shuffle_epi8(rg, mask(kInterleave.rg[1])),
                                    _mm_shuffle_epi8(b, mask(kInterleave.b[1])));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.row + 3 * xo), lo);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o.row + 3 * xo + 16), hi);
  }
}

// Pixels xa (low lane) and xa + 1 (high lane) of a row, rounded, as 32-bit R, G, B, 0: for each
// pair of taps, both pixels' inputs shuffled into (R_k, R_k+1, G_k, G_k+1, B_k, B_k+1, 0, 0)
// words, times the pair of weights with pmaddwd. kPairs > 0: the pair count, known at compile
// time (the loop unrolled); 0: cx.pair_count.
template <int kPairs>
__attribute__((target("avx2"))) inline __m256i two_pixels(const uint8_t* m, const Coefficients& cx, int w, int xa) {
  const __m256i shuffle = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,  //
                                           0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const int n = kPairs > 0 ? kPairs : cx.pair_count;
  const uint8_t* s0 = m + static_cast<size_t>(cx.first[xa]) * 3;
  const uint8_t* s1 = m + static_cast<size_t>(cx.first[xa + 1]) * 3;
  const int32_t* pw = cx.pairs_t.data() + xa;
  __m256i a = _mm256_set1_epi32(1 << (cx.bits - 1));
  for (int j = 0; j < n; ++j, s0 += 6, s1 += 6, pw += w) {
    const __m256i px = _mm256_set_m128i(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s1)),
                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s0)));
    const __m256i wv =
        _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pw))), lanes);
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(px, shuffle), wv));
  }
  return _mm256_sra_epi32(a, _mm_cvtsi32_si128(cx.bits));
}

// A row of at least eight output pixels, eight at a time; the last step overlaps the one before
// (the same values written twice).
template <int kPairs>
__attribute__((target("avx2"))) void horizontal_rows_avx2(const uint8_t* m, const Coefficients& cx, const RowOut& o) {
  const int w = o.width;
  for (int x0 = 0; x0 < w; x0 += 8) {
    const int x = std::min(x0, w - 8);
    const __m256i a0 = two_pixels<kPairs>(m, cx, w, x), a1 = two_pixels<kPairs>(m, cx, w, x + 2);
    const __m256i a2 = two_pixels<kPairs>(m, cx, w, x + 4), a3 = two_pixels<kPairs>(m, cx, w, x + 6);
    store8(o, _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3)), x);
  }
}

// The horizontal pass with AVX2, eight output pixels a step (above); a row narrower than eight
// goes a pixel at a time. Reads up to 5 bytes past a row's last pixel, weighted 0 (`m` is padded).
__attribute__((target("avx2"))) void horizontal_rgb_avx2(const uint8_t* m, const Coefficients& cx, const RowOut& o) {
  const __m128i shuffle = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const int w = o.width, pc = cx.pair_count;
  if (w < 8) {
    for (int x = 0; x < w; ++x) {
      const uint8_t* s = m + static_cast<size_t>(cx.first[x]) * 3;
      __m128i acc = _mm_set1_epi32(1 << (cx.bits - 1));
      for (int j = 0; j < pc; ++j, s += 6) {
        const __m128i px = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_shuffle_epi8(px, shuffle),
                                                 _mm_set1_epi32(cx.pairs[static_cast<size_t>(x) * pc + j])));
      }
      const __m128i v = _mm_sra_epi32(acc, _mm_cvtsi32_si128(cx.bits));
      const auto rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(_mm_packs_epi32(v, v), v)));
      const int xo = o.flip ? w - 1 - x : x;
      for (int c = 0; c < 3; ++c) {
        const auto value = static_cast<uint8_t>(rgb >> (8 * c));
        if (o.plane != 0) {
          o.row[c * o.plane + xo] = value;
        } else {
          o.row[3 * xo + c] = value;
        }
      }
    }
    return;
  }
  switch (pc) {
    case 1: horizontal_rows_avx2<1>(m, cx, o); break;
    case 2: horizontal_rows_avx2<2>(m, cx, o); break;
    case 3: horizontal_rows_avx2<3>(m, cx, o); break;
    default: horizontal_rows_avx2<0>(m, cx, o); break;
  }
}


std::atomic<bool> g_resize_avx2{__builtin_cpu_supports("avx2") != 0};

}  // namespace

bool use_resize_avx2_for_testing(bool enable) {
  return g_resize_avx2.exchange(enable && __builtin_cpu_supports("avx2") != 0);
}

void resize_image(const uint8_t* src, int src_w, int src_h, int src_stride, int channels, uint8_t* dst, int dst_w,
                  int dst_h, bool flip, bool planar) {
  // AVX2 kernels where the CPU has them (checked once, at load), else the portable ones: the
  // same bytes either way, so batches do not depend on the machine.
  const bool avx2 = g_resize_avx2.load(std::memory_order_relaxed);
  const Coefficients cx = coefficients(src_w, dst_w);
  const Coefficients cy = coefficients(src_h, dst_h);
  // As torch (and PIL) resize uint8 images: the horizontal pass first, over the rows the vertical
  // pass reads, rounded to bytes; then the vertical pass. The intermediate holds those rows ×
  // dst_w pixels, mirrored already when flipping, interleaved or as planes as the output is.
  // Buffers are per thread and reused: this runs once per sample on the hot path.
  const int row_first = cy.first.front(), row_count = cy.first.back() + cy.taps - row_first;
  const size_t mid_row = static_cast<size_t>(dst_w) * (planar ? 1 : channels);
  const size_t mid_plane = planar ? mid_row * static_cast<size_t>(row_count) : 0;
  thread_local std::vector<uint8_t> mid, last_row;
  thread_local std::vector<int32_t> acc, sums;
  mid.resize(static_cast<size_t>(row_count) * dst_w * channels + 16);  // padding: the wide loads
  sums.resize(static_cast<size_t>(dst_w) * 3);
  const size_t src_row = static_cast<size_t>(src_w) * channels;
  // The AVX2 kernels load 8 bytes per pair of taps, up to a few bytes past a row's last pixel
  // (weighted 0): a row whose loads would run past the image's last byte is read from a padded
  // copy (the last row; a few more when the image is only a pixel or two wide).
  const size_t reach = static_cast<size_t>(cx.first.back()) * channels + 6 * static_cast<size_t>(cx.pair_count) + 2;
  const size_t image_end = static_cast<size_t>(src_h - 1) * src_stride + src_row;
  for (int r = 0; r < row_count; ++r) {
    const int y = row_first + r;
    const uint8_t* s = src + static_cast<size_t>(y) * src_stride;
    if (static_cast<size_t>(y) * src_stride + reach > image_end) {
      last_row.assign(s, s + src_row);
      last_row.resize(std::max(src_row, reach) + 16, 0);
      s = last_row.data();
    }
    const RowOut o{mid.data() + static_cast<size_t>(r) * mid_row, mid_plane, dst_w, flip};
    if (channels == 3) {
      if (avx2) {
        horizontal_rgb_avx2(s, cx, o);
      } else {
        horizontal_rgb_any(s, cx, o, sums.data());
      }
      continue;
    }
    for (int x = 0; x < dst_w; ++x) {
      const int32_t* wx = &cx.weights[static_cast<size_t>(x) * cx.taps];
      const uint8_t* p = s + static_cast<size_t>(cx.first[x]) * channels;
      const int xo = flip ? dst_w - 1 - x : x;
      for (int c = 0; c < channels; ++c) {
        int32_t a = 0;
        for (int k = 0; k < cx.taps; ++k) a += wx[k] * p[k * channels + c];
        o.row[planar ? c * mid_plane + xo : static_cast<size_t>(xo) * channels + c] = clamp8(a, cx.bits);
      }
    }
  }
  // Vertical: each output row from its taps of intermediate rows, per plane or interleaved.
  const int planes = planar ? channels : 1;
  const int n = static_cast<int>(mid_row);
  acc.resize(mid_row);
  for (int c = 0; c < planes; ++c) {
    const uint8_t* base = mid.data() + static_cast<size_t>(c) * mid_plane;
    uint8_t* out = dst + static_cast<size_t>(c) * dst_w * dst_h;
    for (int y = 0; y < dst_h; ++y) {
      const int32_t* wy = &cy.weights[static_cast<size_t>(y) * cy.taps];
      const uint8_t* s0 = base + static_cast<size_t>(cy.first[y] - row_first) * mid_row;
      uint8_t* o = out + static_cast<size_t>(y) * mid_row;
      if (avx2) {
        vertical_row_avx2(s0, mid_row, wy, &cy.pairs[static_cast<size_t>(y) * cy.pair_count], cy.taps, cy.bits, n,
                          acc.data(), o);
      } else {
        vertical_row(s0, mid_row, wy, cy.taps, cy.bits, n, acc.data(), o);
      }
    }
  }
}

namespace {

// pshufb masks reversing the order of 16 RGB pixels (48 bytes, three 16-byte registers): output
// register r takes from input register i the bytes masks[r][i] names (0x80: none).
struct FlipMasks {
  alignas(16) uint8_t m[3][3][16];
  FlipMasks() {
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < 3; ++i) {
        for (int b = 0; b < 16; ++b) {
          const int k = 16 * r + b;                     // output byte
          const int from = 3 * (15 - k / 3) + k % 3;  // its pixel, mirrored, and its channel
          m[r][i][b] = from / 16 == i ? static_cast<uint8_t>(from % 16) : 0x80;
        }
      }
    }
  }
};

// 16 RGB pixels at `p`, in reverse order, into `out` (both 48 bytes).
__attribute__((target("ssse3"))) inline void reverse16(const uint8_t* p, const FlipMasks& f, __m128i out[3]) {
  const __m128i in[3] = {_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32))};
  for (int r = 0; r < 3; ++r) {
    __m128i v = _mm_setzero_si128();
    for (int i = 0; i < 3; ++i) {
      v = _mm_or_si128(v, _mm_shuffle_epi8(in[i], _mm_load_si128(reinterpret_cast<const __m128i*>(f.m[r][i]))));
    }
    out[r] = v;
  }
}

// A row of RGB pixels mirrored from both ends 16 pixels at a time; returns how many pixels each
// end did (the middle is the caller's).
__attribute__((target("ssse3"))) int hflip_row_rgb_ssse3(uint8_t* row, int w) {
  static const FlipMasks masks;
  int a = 0;
  for (int b = w - 16; a + 16 <= b; a += 16, b -= 16) {
    __m128i left[3], right[3];
    reverse16(row + 3 * a, masks, left);
    reverse16(row + 3 * b, masks, right);
    for (int r = 0; r < 3; ++r) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 3 * a + 16 * r), right[r]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 3 * b + 16 * r), left[r]);
    }
  }
  return a;
}

}  // namespace

void hflip_image(uint8_t* pixels, int w, int h, int channels) {
  if (channels == 3) {  // the usual case, with the pixel's size known to the compiler
    static const bool ssse3 = __builtin_cpu_supports("ssse3");
    for (int y = 0; y < h; ++y) {
      uint8_t* r = pixels + static_cast<size_t>(y) * w * 3;
      const int done = ssse3 ? hflip_row_rgb_ssse3(r, w) : 0;  // pixels [0, done) and [w - done, w)
      for (int a = done, b = w - 1 - done; a < b; ++a, --b) {
        uint8_t t[3];
        std::memcpy(t, r + 3 * a, 3);
        std::memcpy(r + 3 * a, r + 3 * b, 3);
        std::memcpy(r + 3 * b, t, 3);
      }
    }
    return;
  }
  for (int y = 0; y < h; ++y) {
    uint8_t* r = pixels + static_cast<size_t>(y) * w * channels;
    for (int a = 0, b = w - 1; a < b; ++a, --b) {
      for (int c = 0; c < channels; ++c) std::swap(r[a * channels + c], r[b * channels + c]);
    }
  }
}

}  // namespace crucible::data
