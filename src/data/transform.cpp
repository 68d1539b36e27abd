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
  // Every output reads exactly `taps` inputs starting at first[o] (zero weights pad), so the
  // passes never index past the input.
  c.taps = std::min(static_cast<int>(std::ceil(support)) * 2 + 1, in);
  c.first.resize(out);
  c.weights.assign(static_cast<size_t>(out) * c.taps, 0);
  std::vector<double> w(c.taps);
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = std::max(0, static_cast<int>(center - support + 0.5));
    int hi = std::min(in, static_cast<int>(center + support + 0.5));
    if (hi - lo > c.taps) hi = lo + c.taps;
    double sum = 0;
    for (int i = lo; i < hi; ++i) {
      const double t = std::abs((i - center + 0.5) / filter_scale);
      w[i - lo] = t < 1.0 ? 1.0 - t : 0.0;
      sum += w[i - lo];
    }
    const int first = std::min(lo, in - c.taps);
    c.first[o] = first;
    int32_t* dst = &c.weights[static_cast<size_t>(o) * c.taps];
    for (int i = lo; i < hi; ++i) {
      dst[i - first] = static_cast<int32_t>(std::lround((sum > 0 ? w[i - lo] / sum : 0.0) * (1 << kBits)));
    }
  }
  return c;
}

inline uint8_t clamp8(int32_t v) {
  v = (v + (1 << (kBits - 1))) >> kBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

void resize_image(const uint8_t* src, int src_w, int src_h, int src_stride, int channels, uint8_t* dst, int dst_w,
                  int dst_h) {
  const Coefficients cx = coefficients(src_w, dst_w);
  const Coefficients cy = coefficients(src_h, dst_h);
  // Vertical pass first (on contiguous rows, which vectorises), into an intermediate of
  // dst_h rows × src_w pixels; then the horizontal pass.
  const int row = src_w * channels;
  std::vector<uint8_t> mid(static_cast<size_t>(dst_h) * row);
  std::vector<int32_t> acc(row);
  for (int y = 0; y < dst_h; ++y) {
    std::fill(acc.begin(), acc.end(), 0);
    const int32_t* wy = &cy.weights[static_cast<size_t>(y) * cy.taps];
    for (int k = 0; k < cy.taps; ++k) {
      const int32_t wk = wy[k];
      if (wk == 0) continue;
      const uint8_t* s = src + static_cast<size_t>(cy.first[y] + k) * src_stride;
      for (int i = 0; i < row; ++i) acc[i] += wk * s[i];
    }
    uint8_t* m = &mid[static_cast<size_t>(y) * row];
    for (int i = 0; i < row; ++i) m[i] = clamp8(acc[i]);
  }
  for (int y = 0; y < dst_h; ++y) {
    const uint8_t* m = &mid[static_cast<size_t>(y) * row];
    uint8_t* d = dst + static_cast<size_t>(y) * dst_w * channels;
    for (int x = 0; x < dst_w; ++x) {
      const int32_t* wx = &cx.weights[static_cast<size_t>(x) * cx.taps];
      const uint8_t* s = m + static_cast<size_t>(cx.first[x]) * channels;
      for (int c = 0; c < channels; ++c) {
        int32_t a = 0;
        for (int k = 0; k < cx.taps; ++k) a += wx[k] * s[k * channels + c];
        d[x * channels + c] = clamp8(a);
      }
    }
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
