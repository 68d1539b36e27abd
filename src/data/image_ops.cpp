// torchvision.transforms.v2.functional's uint8 arithmetic (see image_ops.h). Each function names
// the torchvision lines it follows; "fma" marks where torch's vectorised CPU kernels fuse
// (`a.add_(b, alpha=s)` is fmadd(b, s, a) in ATen's add kernel, on every element).
#include "crucible/data/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "crucible/core/error.h"

// The operations call std::fma where torch fuses; without the FMA instruction (the baseline
// x86-64 build) that is a software routine of tens of nanoseconds. The loops that call it are
// compiled twice, with FMA and without, and the CPU picks at load time (GCC's target_clones):
// the same results either way (fma is exactly rounded), several times faster with it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CRUCIBLE_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define CRUCIBLE_FMA_CLONES
#endif

namespace crucible::data::ops {
namespace {

// Element (c, y, x) of an ImageRef.
struct View {
  uint8_t* p;
  int w, h, c;
  size_t cs, ps;  // channel and pixel strides
  explicit View(ImageRef r)
      : p(r.pixels), w(r.width), h(r.height), c(r.channels),
        cs(r.planar ? static_cast<size_t>(r.width) * r.height : 1), ps(r.planar ? 1 : static_cast<size_t>(r.channels)) {}
  uint8_t& at(int ch, int y, int x) const {
    return p[static_cast<size_t>(ch) * cs + (static_cast<size_t>(y) * w + x) * ps];
  }
  size_t bytes() const { return static_cast<size_t>(w) * h * c; }
  size_t pixels() const { return static_cast<size_t>(w) * h; }
};

void check_channels(ImageRef image, const char* op) {
  if (image.channels != 1 && image.channels != 3) {
    throw bad_input("{}: images with 1 or 3 channels are supported, found {}", op, image.channels);
  }
}

// float32 → uint8 as torch's .to(torch.uint8) after clamp_(0, 255): truncation toward zero.
// Truncating first and clamping the integer gives the same byte for every finite value the
// operations produce (far inside int's range), and compiles to conditional moves: no branch to
// mispredict on noisy pixels.
inline uint8_t to_u8(float v) {
  int i = static_cast<int>(v);
  i = i < 0 ? 0 : i;
  return static_cast<uint8_t>(i > 255 ? 255 : i);
}

// std::nearbyint and std::floor of a float32 in the default rounding mode, inline: without
// SSE4.1 (the baseline x86-64 build) glibc's are calls, a large share of a warp. Adding and
// subtracting 1.5·2^23 rounds to an integer, half to even, for |x| < 2^22; beyond, the libm call.
inline float round_even(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 · 2^23
  return std::fabs(x) < 4194304.0f ? (x + kShift) - kShift : std::nearbyint(x);
}
inline float floor_f(float x) {
  const float t = round_even(x);
  return t - static_cast<float>(t > x);  // (no branch: fractions are a coin toss)
}

// A table of f(0) … f(255): an operation whose result depends on the value alone (and on
// scalars of the image) computed once per value, then looked up — the same arithmetic, exactly.
template <class F>
void apply_lut(uint8_t* p, size_t n, F f) {
  uint8_t lut[256];
  for (int k = 0; k < 256; ++k) lut[k] = f(k);
  for (size_t i = 0; i < n; ++i) p[i] = lut[p[i]];
}

// _rgb_to_grayscale_image(preserve_dtype=False).floor_(): r·0.2989, then fma with g·0.587 and b·0.114.
// (The loops below keep the View's fields in locals: the compiler cannot, as stores through
// uint8_t* may alias anything.)
CRUCIBLE_FMA_CLONES void floor_grayscale(const View& v, std::vector<float>& gray) {
  const size_t n = v.pixels(), cs = v.cs, ps = v.ps;
  gray.resize(n);
  const uint8_t* r = v.p;
  const uint8_t* g = r + cs;
  const uint8_t* b = g + cs;
  float* out = gray.data();
  for (size_t i = 0; i < n; ++i) {
    float l = static_cast<float>(r[i * ps]) * 0.2989f;
    l = std::fma(static_cast<float>(g[i * ps]), 0.587f, l);
    l = std::fma(static_cast<float>(b[i * ps]), 0.114f, l);
    out[i] = floor_f(l);
  }
}

// _blend(image, other, ratio) with `other` per pixel (stride 1) or one value (stride 0):
// image.mul(ratio).add_(other, alpha=1 - ratio), clamped and truncated.
CRUCIBLE_FMA_CLONES void blend(const View& v, const float* other, size_t other_stride, double ratio) {
  const float r = static_cast<float>(ratio), s = static_cast<float>(1.0 - ratio);
  if (other_stride == 0) {  // one value for every pixel: a table
    const float o = other[0];
    apply_lut(v.p, v.bytes(), [&](int k) { return to_u8(std::fma(o, s, static_cast<float>(k) * r)); });
    return;
  }
  const size_t n = v.pixels(), ps = v.ps;
  for (int ch = 0; ch < v.c; ++ch) {
    uint8_t* q = v.p + static_cast<size_t>(ch) * v.cs;
    for (size_t i = 0; i < n; ++i) {
      q[i * ps] = to_u8(std::fma(other[i], s, static_cast<float>(q[i * ps]) * r));
    }
  }
}

void check_factor(double factor, const char* name) {
  if (!(factor >= 0.0)) throw bad_input("{} must be non-negative, found {}", name, factor);
}

// Python's float modulo (the result takes the divisor's sign), as rotate_image's `angle % 360`.
double py_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0.0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

// _get_inverse_affine_matrix(center, angle, translate, scale, shear), in double as Python.
std::array<double, 6> inverse_affine_matrix(double cx, double cy, double angle, double tx, double ty, double scale,
                                            double shear_x, double shear_y) {
  const double rot = angle * M_PI / 180.0, sx = shear_x * M_PI / 180.0, sy = shear_y * M_PI / 180.0;
  const double cos_sy = std::cos(sy), tan_sx = std::tan(sx), rot_minus_sy = rot - sy;
  const double cx_plus_tx = cx + tx, cy_plus_ty = cy + ty;
  const double a = std::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + std::sin(rot));
  const double c = std::sin(rot_minus_sy) / cos_sy;
  const double d = std::cos(rot) - c * tan_sx;
  std::array<double, 6> m = {d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

// A planar copy of the source, (c, y, x) at c·h·w + y·w + x, in this thread's scratch buffer
// (valid until the next call on the thread): warps and rotations read it while writing v.
const std::vector<uint8_t>& planar_copy(const View& v) {
  thread_local std::vector<uint8_t> copy;
  const size_t plane = v.pixels();
  copy.resize(v.bytes());
  for (int ch = 0; ch < v.c; ++ch) {
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) copy[ch * plane + static_cast<size_t>(y) * v.w + x] = v.at(ch, y, x);
    }
  }
  return copy;
}

// _affine_grid + _apply_grid_transform (grid_sample, zeros padding, align_corners=False, the
// fill blended through the sampled mask) for an output the input's size.
CRUCIBLE_FMA_CLONES void warp(const View& v, const std::array<double, 6>& matrix, Interpolation mode,
                              const Fill& fill) {
  const std::vector<uint8_t>& copy = planar_copy(v);
  const uint8_t* src = copy.data();
  const int w = v.w, h = v.h, channels = v.c;
  const size_t plane = v.pixels(), cs = v.cs, ps = v.ps;
  uint8_t* out = v.p;
  const bool fill_set = fill.set;
  float fill_value[3] = {fill.value[0], fill.value[1], fill.value[2]};
  // theta (float32) transposed and divided by [0.5 w, 0.5 h]; the base grid's x, y, 1 times it,
  // as bmm computes it (x·a, fma with y·b, + c).
  float rt[3][2];
  const float half_w = static_cast<float>(0.5 * w), half_h = static_cast<float>(0.5 * h);
  for (int k = 0; k < 3; ++k) {
    rt[k][0] = static_cast<float>(matrix[k]) / half_w;
    rt[k][1] = static_cast<float>(matrix[3 + k]) / half_h;
  }
  const float a0 = rt[0][0], a1 = rt[0][1], b0 = rt[1][0], b1 = rt[1][1], c0 = rt[2][0], c1 = rt[2][1];
  // grid_sample's unnormalisation: (g + 1) · size / 2 - 0.5.
  const float scale_x = static_cast<float>(w) / 2, scale_y = static_cast<float>(h) / 2;
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  auto at = [src, plane, w](int ch, int y, int x) {
    return static_cast<float>(src[ch * plane + static_cast<size_t>(y) * w + x]);
  };
  for (int oy = 0; oy < h; ++oy) {
    const float by = static_cast<float>((1.0 - h) * 0.5 + oy);
    uint8_t* row = out + static_cast<size_t>(oy) * w * ps;
    for (int ox = 0; ox < w; ++ox) {
      const float bx = static_cast<float>((1.0 - w) * 0.5 + ox);
      const float gx = std::fma(by, b0, bx * a0) + c0;
      const float gy = std::fma(by, b1, bx * a1) + c1;
      const float ix = (gx + 1.0f) * scale_x - 0.5f;
      const float iy = (gy + 1.0f) * scale_y - 0.5f;
      uint8_t* dst = row + static_cast<size_t>(ox) * ps;
      if (mode == Interpolation::kNearest) {
        const float xn = round_even(ix), yn = round_even(iy);
        const bool in = xn > -1.0f && xn < fw && yn > -1.0f && yn < fh;
        for (int ch = 0; ch < channels; ++ch) {
          float val = in ? at(ch, static_cast<int>(yn), static_cast<int>(xn)) : 0.0f;  // a whole number
          if (fill_set && !in) val = round_even(fill_value[ch]);
          dst[ch * cs] = static_cast<uint8_t>(val);
        }
      } else {
        const float x0 = floor_f(ix), y0 = floor_f(iy);
        const float wx = ix - x0, ex = 1.0f - wx, ny = iy - y0, sy = 1.0f - ny;
        const float nw = sy * ex, ne = sy * wx, sw = ny * ex, se = ny * wx;
        // (clamped first: a far coordinate only needs to stay out of bounds)
        const int xi = static_cast<int>(std::min(std::max(x0, -2.0f), fw + 1.0f));
        const int yi = static_cast<int>(std::min(std::max(y0, -2.0f), fh + 1.0f));
        const bool in_w = xi >= 0 && xi < w, in_e = xi + 1 >= 0 && xi + 1 < w;
        const bool in_n = yi >= 0 && yi < h, in_s = yi + 1 >= 0 && yi + 1 < h;
        const bool in_nw = in_n && in_w, in_ne = in_n && in_e, in_sw = in_s && in_w, in_se = in_s && in_e;
        float mask = 1.0f;
        if (fill_set) {
          mask = in_nw ? nw : 0.0f;
          mask = std::fma(in_ne ? 1.0f : 0.0f, ne, mask);
          mask = std::fma(in_sw ? 1.0f : 0.0f, sw, mask);
          mask = std::fma(in_se ? 1.0f : 0.0f, se, mask);
        }
        for (int ch = 0; ch < channels; ++ch) {
          float val = (in_nw ? at(ch, yi, xi) : 0.0f) * nw;
          val = std::fma(in_ne ? at(ch, yi, xi + 1) : 0.0f, ne, val);
          val = std::fma(in_sw ? at(ch, yi + 1, xi) : 0.0f, sw, val);
          val = std::fma(in_se ? at(ch, yi + 1, xi + 1) : 0.0f, se, val);
          if (fill_set) {
            const float f = fill_value[ch];
            val = (val - f) * mask + f;
          }
          dst[ch * cs] = to_u8(round_even(val));
        }
      }
    }
  }
}

// torch.rot90(image, k, dims=(-2, -1)) for k = 1, 2, 3 (k = 1: out[i][j] = in[j][w-1-i]).
void rot90(const View& v, int k) {
  const std::vector<uint8_t>& copy = planar_copy(v);
  const size_t plane = v.pixels();
  for (int ch = 0; ch < v.c; ++ch) {
    const uint8_t* in = copy.data() + ch * plane;
    for (int i = 0; i < v.h; ++i) {
      for (int j = 0; j < v.w; ++j) {
        uint8_t val;
        if (k == 2) {
          val = in[static_cast<size_t>(v.h - 1 - i) * v.w + (v.w - 1 - j)];
        } else if (k == 1) {
          val = in[static_cast<size_t>(j) * v.w + (v.w - 1 - i)];
        } else {
          val = in[static_cast<size_t>(v.h - 1 - j) * v.w + i];
        }
        v.at(ch, i, j) = val;
      }
    }
  }
}

}  // namespace

const char* interpolation_name(Interpolation mode) {
  return mode == Interpolation::kNearest ? "nearest" : "bilinear";
}

Interpolation parse_interpolation(const std::string& name, const char* key) {
  if (name == "nearest") return Interpolation::kNearest;
  if (name == "bilinear") return Interpolation::kBilinear;
  throw bad_input("{}: unknown interpolation \"{}\" (expected \"nearest\" or \"bilinear\", torchvision's modes "
                  "for tensors)",
                  key, name);
}

// adjust_brightness_image: image.mul(factor).clamp_(0, 255).to(uint8).
void adjust_brightness(ImageRef image, double factor) {
  check_channels(image, "adjust_brightness");
  check_factor(factor, "brightness_factor");
  const float f = static_cast<float>(factor);
  View v(image);
  for (size_t i = 0, n = v.bytes(); i < n; ++i) image.pixels[i] = to_u8(static_cast<float>(image.pixels[i]) * f);
}

void adjust_saturation(ImageRef image, double factor) {
  check_channels(image, "adjust_saturation");
  check_factor(factor, "saturation_factor");
  if (image.channels == 1) return;  // as PIL
  View v(image);
  thread_local std::vector<float> gray;
  floor_grayscale(v, gray);
  blend(v, gray.data(), 1, factor);
}

void adjust_contrast(ImageRef image, double factor) {
  check_channels(image, "adjust_contrast");
  check_factor(factor, "contrast_factor");
  View v(image);
  // torch.mean of the (floored) grayscale: a float32 sum of whole numbers (exact below 2^24,
  // kept exact here in double) divided by the count in float32.
  double sum = 0;
  if (image.channels == 3) {
    thread_local std::vector<float> gray;
    floor_grayscale(v, gray);
    for (float g : gray) sum += g;
  } else {
    for (size_t i = 0, n = v.bytes(); i < n; ++i) sum += image.pixels[i];
  }
  const float mean = static_cast<float>(sum) / static_cast<float>(v.pixels());
  blend(v, &mean, 0, factor);
}

CRUCIBLE_FMA_CLONES void adjust_sharpness(ImageRef image, double factor) {
  check_channels(image, "adjust_sharpness");
  check_factor(factor, "sharpness_factor");
  View v(image);
  if (v.w <= 2 || v.h <= 2) return;
  // The blur, conv2d with 1/13 and 5/13 then round_(): round(sum / 13) of whole numbers, which is
  // never a tie (13 is odd) and lies far enough from one for float32's error, so integer
  // arithmetic gives torch's value. Then view.add_(blur - view, alpha=1 - factor) (fma).
  const float alpha = static_cast<float>(1.0 - factor);
  thread_local std::vector<uint8_t> copy;
  copy.resize(v.pixels());
  for (int ch = 0; ch < v.c; ++ch) {
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) copy[static_cast<size_t>(y) * v.w + x] = v.at(ch, y, x);
    }
    for (int y = 1; y < v.h - 1; ++y) {
      const uint8_t* up = copy.data() + static_cast<size_t>(y - 1) * v.w;
      const uint8_t* mid = up + v.w;
      const uint8_t* down = mid + v.w;
      for (int x = 1; x < v.w - 1; ++x) {
        const int s = up[x - 1] + up[x] + up[x + 1] + mid[x - 1] + 5 * mid[x] + mid[x + 1] + down[x - 1] + down[x] +
                      down[x + 1];
        const int blur = (2 * s + 13) / 26;  // round(s / 13)
        const float px = static_cast<float>(mid[x]);
        v.at(ch, y, x) = to_u8(std::fma(static_cast<float>(blur) - px, alpha, px));
      }
    }
  }
}

void posterize(ImageRef image, int bits) {
  if (bits < 0 || bits > 8) throw bad_input("posterize: bits must be in [0, 8], found {}", bits);
  if (bits >= 8) return;
  const uint8_t mask = static_cast<uint8_t>(((1 << bits) - 1) << (8 - bits));
  View v(image);
  for (size_t i = 0, n = v.bytes(); i < n; ++i) image.pixels[i] &= mask;
}

// torch.where(image >= threshold, 255 - image, image), the comparison in float32.
void solarize(ImageRef image, double threshold) {
  if (threshold > 255.0) throw bad_input("solarize: threshold must be <= 255, found {}", threshold);
  const float t = static_cast<float>(threshold);
  View v(image);
  apply_lut(image.pixels, v.bytes(), [t](int k) { return static_cast<uint8_t>(static_cast<float>(k) >= t ? 255 - k : k); });
}

// autocontrast_image: per channel, (x - min) / ((max - min) · float32(1/255)), clamped, truncated;
// a flat channel stays as it is.
void autocontrast(ImageRef image) {
  check_channels(image, "autocontrast");
  View v(image);
  for (int ch = 0; ch < v.c; ++ch) {
    int lo = 255, hi = 0;
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) {
        lo = std::min<int>(lo, v.at(ch, y, x));
        hi = std::max<int>(hi, v.at(ch, y, x));
      }
    }
    if (lo == hi) continue;
    const float inv_scale = static_cast<float>(hi - lo) * static_cast<float>(1.0 / 255.0);
    uint8_t lut[256];
    for (int k = 0; k < 256; ++k) lut[k] = to_u8(static_cast<float>(k - lo) / inv_scale);
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) v.at(ch, y, x) = lut[v.at(ch, y, x)];
    }
  }
}

// equalize_image: lut[k] = (cum_hist[k-1] + step // 2) // step with step = (pixels not of the
// last non-empty bin) // 255, lut[0] = 0; the channel stays as it is when step is 0.
void equalize(ImageRef image) {
  check_channels(image, "equalize");
  View v(image);
  for (int ch = 0; ch < v.c; ++ch) {
    int64_t hist[256] = {0};
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) ++hist[v.at(ch, y, x)];
    }
    int last = 255;
    while (last > 0 && hist[last] == 0) --last;
    const int64_t step = (static_cast<int64_t>(v.pixels()) - hist[last]) / 255;
    if (step == 0) continue;
    uint8_t lut[256];
    lut[0] = 0;
    int64_t cum = 0;
    for (int k = 1; k < 256; ++k) {
      cum += hist[k - 1];
      lut[k] = static_cast<uint8_t>(std::min<int64_t>(255, (cum + step / 2) / step));
    }
    for (int y = 0; y < v.h; ++y) {
      for (int x = 0; x < v.w; ++x) v.at(ch, y, x) = lut[v.at(ch, y, x)];
    }
  }
}

void invert(ImageRef image) {
  View v(image);
  for (size_t i = 0, n = v.bytes(); i < n; ++i) image.pixels[i] = static_cast<uint8_t>(255 - image.pixels[i]);
}

void affine(ImageRef image, double angle, double translate_x, double translate_y, double scale, double shear_x,
            double shear_y, Interpolation interpolation, const Fill& fill, const double* center) {
  check_channels(image, "affine");
  if (!(scale > 0.0)) throw bad_input("affine: scale must be positive, found {}", scale);
  View v(image);
  double cx = 0.0, cy = 0.0;  // centre relative to the image's centre
  if (center) {
    cx = center[0] - v.w * 0.5;
    cy = center[1] - v.h * 0.5;
  }
  warp(v, inverse_affine_matrix(cx, cy, angle, translate_x, translate_y, scale, shear_x, shear_y), interpolation, fill);
}

void rotate(ImageRef image, double angle, Interpolation interpolation, const Fill& fill) {
  check_channels(image, "rotate");
  View v(image);
  angle = py_mod(angle, 360.0);
  if (angle == 0.0) return;
  if (angle == 180.0) return rot90(v, 2);
  if (v.w == v.h && angle == 90.0) return rot90(v, 1);
  if (v.w == v.h && angle == 270.0) return rot90(v, 3);
  // The direction differs between affine and rotate in torchvision: rotate passes -angle.
  warp(v, inverse_affine_matrix(0.0, 0.0, -angle, 0.0, 0.0, 1.0, 0.0, 0.0), interpolation, fill);
}

}  // namespace crucible::data::ops
