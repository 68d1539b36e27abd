// Crop geometry and the resize kernel (hand-written: no Debian library resizes without
// per-size setup or its own threads, which would nest inside the loader's pool — D7).
#include "crucible/data/transform.h"

#include <algorithm>
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
  const int size = static_cast<int>(crop / fraction);  // Python's int(crop / fraction)
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

constexpr int kBits = 14;

// For each output index: the first input index and `taps` 14-bit weights (PIL's bilinear
// support, widened by the scale when shrinking so that it averages instead of aliasing).
struct Coefficients {
  int taps = 0;
  std::vector<int> first;
  std::vector<int32_t> weights;  // [out][taps]
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
  std::vector<double> w(static_cast<size_t>(c.taps));
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    double sum = 0;
    for (int i = lo[o]; i < hi[o]; ++i) {
      const double t = std::abs((i - center + 0.5) / filter_scale);
      w[i - lo[o]] = t < 1.0 ? 1.0 - t : 0.0;
      sum += w[i - lo[o]];
    }
    const int first = std::min(lo[o], in - c.taps);
    c.first[o] = first;
    int32_t* dst = &c.weights[static_cast<size_t>(o) * c.taps];
    for (int i = lo[o]; i < hi[o]; ++i) {
      dst[i - first] = static_cast<int32_t>(std::lround((sum > 0 ? w[i - lo[o]] / sum : 0.0) * (1 << kBits)));
    }
  }
  return c;
}

__attribute__((always_inline)) inline uint8_t clamp8(int32_t v) {
  v = (v + (1 << (kBits - 1))) >> kBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// One row of the horizontal pass for RGB with a tap count known at compile time (unrolled,
// weights in registers; kTaps = 0 handles any count). Each tap reads 4 bytes (RGB plus the
// next pixel's R, ignored) so the four lanes vectorise; rows carry one byte of padding.
template <int kTaps>
__attribute__((always_inline)) inline void horizontal_rgb(const uint8_t* m, const Coefficients& cx, int taps,
                                                          uint8_t* d, int dst_w, bool flip, int32_t* sums) {
  const int n = kTaps > 0 ? kTaps : taps;
  for (int x = 0; x < dst_w; ++x) {
    const int32_t* wx = &cx.weights[static_cast<size_t>(x) * n];
    const uint8_t* s = m + static_cast<size_t>(cx.first[x]) * 3;
    int32_t a[4] = {0, 0, 0, 0};
    for (int k = 0; k < n; ++k) {
      const int32_t w = wx[k];
      for (int c = 0; c < 4; ++c) a[c] += w * s[3 * k + c];
    }
    int32_t* o = sums + 3 * (flip ? dst_w - 1 - x : x);
    o[0] = a[0];
    o[1] = a[1];
    o[2] = a[2];
  }
  // Rounding and clamping for the whole row at once (this loop vectorises; per pixel it did not).
  for (int i = 0; i < 3 * dst_w; ++i) d[i] = clamp8(sums[i]);
}

}  // namespace

// Built for AVX2 and for the baseline ISA; the loader picks at run time (ifunc).
__attribute__((target_clones("avx2", "default"))) void resize_image(const uint8_t* src, int src_w, int src_h,
                                                                   int src_stride, int channels, uint8_t* dst,
                                                                   int dst_w, int dst_h, bool flip) {
  const Coefficients cx = coefficients(src_w, dst_w);
  const Coefficients cy = coefficients(src_h, dst_h);
  // Vertical pass first, on contiguous rows (the inner loop vectorises), into an intermediate
  // of dst_h rows × src_w pixels; then the horizontal pass, all channels of a pixel at once.
  // Buffers are per thread and reused: this runs once per sample on the hot path.
  const int row = src_w * channels;
  thread_local std::vector<uint8_t> mid;
  thread_local std::vector<int32_t> acc;
  mid.resize(static_cast<size_t>(dst_h) * row + 16);  // padding: the wide loads of the last pixels
  acc.resize(static_cast<size_t>(row));
  for (int y = 0; y < dst_h; ++y) {
    int32_t* a = acc.data();
    const int32_t* wy = &cy.weights[static_cast<size_t>(y) * cy.taps];
    const uint8_t* s0 = src + static_cast<size_t>(cy.first[y]) * src_stride;
    {
      const int32_t w0 = wy[0];
      for (int i = 0; i < row; ++i) a[i] = w0 * s0[i];
    }
    for (int k = 1; k < cy.taps; ++k) {
      const int32_t wk = wy[k];
      if (wk == 0) continue;
      const uint8_t* s = s0 + static_cast<size_t>(k) * src_stride;
      for (int i = 0; i < row; ++i) a[i] += wk * s[i];
    }
    uint8_t* m = &mid[static_cast<size_t>(y) * row];
    for (int i = 0; i < row; ++i) m[i] = clamp8(a[i]);
  }
  const int taps = cx.taps;
  thread_local std::vector<int32_t> sums;
  sums.resize(static_cast<size_t>(dst_w) * 3);
  for (int y = 0; y < dst_h; ++y) {
    const uint8_t* m = &mid[static_cast<size_t>(y) * row];
    uint8_t* d = dst + static_cast<size_t>(y) * dst_w * channels;
    if (channels == 3) {
      switch (taps) {
        case 2: horizontal_rgb<2>(m, cx, taps, d, dst_w, flip, sums.data()); break;
        case 3: horizontal_rgb<3>(m, cx, taps, d, dst_w, flip, sums.data()); break;
        case 4: horizontal_rgb<4>(m, cx, taps, d, dst_w, flip, sums.data()); break;
        case 5: horizontal_rgb<5>(m, cx, taps, d, dst_w, flip, sums.data()); break;
        default: horizontal_rgb<0>(m, cx, taps, d, dst_w, flip, sums.data()); break;
      }
      continue;
    }
    for (int x = 0; x < dst_w; ++x) {
      const int32_t* wx = &cx.weights[static_cast<size_t>(x) * taps];
      const uint8_t* s = m + static_cast<size_t>(cx.first[x]) * channels;
      for (int c = 0; c < channels; ++c) {
        int32_t a = 0;
        for (int k = 0; k < taps; ++k) a += wx[k] * s[k * channels + c];
        d[x * channels + c] = clamp8(a);
      }
    }
    if (flip) hflip_image(d, dst_w, 1, channels);
  }
}

void hflip_image(uint8_t* pixels, int w, int h, int channels) {
  for (int y = 0; y < h; ++y) {
    uint8_t* r = pixels + static_cast<size_t>(y) * w * channels;
    for (int a = 0, b = w - 1; a < b; ++a, --b) {
      for (int c = 0; c < channels; ++c) std::swap(r[a * channels + c], r[b * channels + c]);
    }
  }
}

}  // namespace crucible::data
