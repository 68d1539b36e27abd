// torchvision.transforms.v2.functional's uint8 arithmetic (see image_ops.h). Each function names
// the torchvision lines it follows; "fma" marks where torch's vectorised CPU kernels fuse
// (`a.add_(b, alpha=s)` is fmadd(b, s, a) in ATen's add kernel, on every element).
#include "crucible/data/image/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
// fill blended through the sampled mask) for an output the input's size. warp_span computes the
// pixels ox_begin … ox_end-1 of row oy one at a time; warp_span_avx2 eight at a time with the
// same operations in the same order on each lane (IEEE arithmetic is lane-wise: the same bytes),
// used when the CPU has AVX2 and FMA.
bool vector_warp_allowed = true;  // testing::set_vector_warp

struct Warp {
  const uint8_t* src;  // planar copy of the source
  uint8_t* out;
  int w, h, channels;
  size_t plane, cs, ps;
  bool nearest, fill_set;
  float fill_value[3];
  // theta (float32) transposed and divided by [0.5 w, 0.5 h]: the base grid's x, y, 1 times it,
  // as torch 2.x's bmm computes it on x86 (MKL): (x·a + y·b) + c, each product and sum rounded
  // (Debian's 1.13 through OpenBLAS fuses x·a + y·b; nearest sampling then differs where a
  // point falls exactly halfway between pixels).
  float a0, a1, b0, b1, c0, c1;
  // grid_sample's unnormalisation: (g + 1) · size / 2 - 0.5.
  float scale_x, scale_y, fw, fh;
  float at(int ch, int y, int x) const { return static_cast<float>(src[ch * plane + static_cast<size_t>(y) * w + x]); }
};

CRUCIBLE_FMA_CLONES void warp_span(const Warp& k, int oy, int ox_begin, int ox_end) {
  const float by = static_cast<float>((1.0 - k.h) * 0.5 + oy);
  uint8_t* row = k.out + static_cast<size_t>(oy) * k.w * k.ps;
  for (int ox = ox_begin; ox < ox_end; ++ox) {
    const float bx = static_cast<float>((1.0 - k.w) * 0.5 + ox);
    const float gx = (bx * k.a0 + by * k.b0) + k.c0;
    const float gy = (bx * k.a1 + by * k.b1) + k.c1;
    const float ix = (gx + 1.0f) * k.scale_x - 0.5f;
    const float iy = (gy + 1.0f) * k.scale_y - 0.5f;
    uint8_t* dst = row + static_cast<size_t>(ox) * k.ps;
    if (k.nearest) {
      const float xn = round_even(ix), yn = round_even(iy);
      const bool in = xn > -1.0f && xn < k.fw && yn > -1.0f && yn < k.fh;
      for (int ch = 0; ch < k.channels; ++ch) {
        float val = in ? k.at(ch, static_cast<int>(yn), static_cast<int>(xn)) : 0.0f;  // a whole number
        if (k.fill_set && !in) val = round_even(k.fill_value[ch]);
        dst[ch * k.cs] = static_cast<uint8_t>(val);
      }
      continue;
    }
    const float x0 = floor_f(ix), y0 = floor_f(iy);
    const float wx = ix - x0, ex = 1.0f - wx, ny = iy - y0, sy = 1.0f - ny;
    const float nw = sy * ex, ne = sy * wx, sw = ny * ex, se = ny * wx;
    // (clamped first: a far coordinate only needs to stay out of bounds)
    const int xi = static_cast<int>(std::min(std::max(x0, -2.0f), k.fw + 1.0f));
    const int yi = static_cast<int>(std::min(std::max(y0, -2.0f), k.fh + 1.0f));
    const bool in_w = xi >= 0 && xi < k.w, in_e = xi + 1 >= 0 && xi + 1 < k.w;
    const bool in_n = yi >= 0 && yi < k.h, in_s = yi + 1 >= 0 && yi + 1 < k.h;
    const bool in_nw = in_n && in_w, in_ne = in_n && in_e, in_sw = in_s && in_w, in_se = in_s && in_e;
    float mask = 1.0f;
    if (k.fill_set) {
      mask = in_nw ? nw : 0.0f;
      mask = std::fma(in_ne ? 1.0f : 0.0f, ne, mask);
      mask = std::fma(in_sw ? 1.0f : 0.0f, sw, mask);
      mask = std::fma(in_se ? 1.0f : 0.0f, se, mask);
    }
    for (int ch = 0; ch < k.channels; ++ch) {
      float val = (in_nw ? k.at(ch, yi, xi) : 0.0f) * nw;
      val = std::fma(in_ne ? k.at(ch, yi, xi + 1) : 0.0f, ne, val);
      val = std::fma(in_sw ? k.at(ch, yi + 1, xi) : 0.0f, sw, val);
      val = std::fma(in_se ? k.at(ch, yi + 1, xi + 1) : 0.0f, se, val);
      if (k.fill_set) {
        const float f = k.fill_value[ch];
        val = (val - f) * mask + f;
      }
      dst[ch * k.cs] = to_u8(round_even(val));
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRUCIBLE_WARP_AVX2 1
// Rows in blocks of eight pixels: the grid, the rounding and the weights in AVX2 registers; the
// neighbours gathered lane by lane (out-of-bounds lanes read 0, as the scalar code multiplies 0);
// the weighted sums, rounding and clamp again in registers. The tail goes to warp_span.
__attribute__((target("avx2,fma"))) void warp_span_avx2(const Warp& k, int oy) {
  const float by = static_cast<float>((1.0 - k.h) * 0.5 + oy);
  uint8_t* row = k.out + static_cast<size_t>(oy) * k.w * k.ps;
  const __m256 vby = _mm256_set1_ps(by);
  const __m256 a0 = _mm256_set1_ps(k.a0), a1 = _mm256_set1_ps(k.a1), b0 = _mm256_set1_ps(k.b0),
               b1 = _mm256_set1_ps(k.b1), c0 = _mm256_set1_ps(k.c0), c1 = _mm256_set1_ps(k.c1);
  const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), sx = _mm256_set1_ps(k.scale_x),
               sy_ = _mm256_set1_ps(k.scale_y);
  const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const float base = static_cast<float>((1.0 - k.w) * 0.5);  // bx = base + ox: half-integers, exact
  const int blocks = k.w / 8;
  alignas(32) float ix_a[8], iy_a[8], w_a[4][8];
  alignas(32) int xi_a[8], yi_a[8];
  for (int bk = 0; bk < blocks; ++bk) {
    const int ox0 = bk * 8;
    const __m256 bx = _mm256_add_ps(_mm256_set1_ps(base + static_cast<float>(ox0)), lanes);
    const __m256 gx = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(bx, a0), _mm256_mul_ps(vby, b0)), c0);
    const __m256 gy = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(bx, a1), _mm256_mul_ps(vby, b1)), c1);
    const __m256 ix = _mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(gx, one), sx), half);
    const __m256 iy = _mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(gy, one), sy_), half);
    if (k.nearest) {
      // nearbyint in the default rounding mode, as round_even
      _mm256_store_ps(ix_a, _mm256_round_ps(ix, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      _mm256_store_ps(iy_a, _mm256_round_ps(iy, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      for (int l = 0; l < 8; ++l) {
        const float xn = ix_a[l], yn = iy_a[l];
        const bool in = xn > -1.0f && xn < k.fw && yn > -1.0f && yn < k.fh;
        uint8_t* dst = row + static_cast<size_t>(ox0 + l) * k.ps;
        for (int ch = 0; ch < k.channels; ++ch) {
          float val = in ? k.at(ch, static_cast<int>(yn), static_cast<int>(xn)) : 0.0f;
          if (k.fill_set && !in) val = round_even(k.fill_value[ch]);
          dst[ch * k.cs] = static_cast<uint8_t>(val);
        }
      }
      continue;
    }
    const __m256 x0 = _mm256_floor_ps(ix), y0 = _mm256_floor_ps(iy);
    const __m256 wx = _mm256_sub_ps(ix, x0), ex = _mm256_sub_ps(one, wx);
    const __m256 ny = _mm256_sub_ps(iy, y0), sy = _mm256_sub_ps(one, ny);
    const __m256 nw = _mm256_mul_ps(sy, ex), ne = _mm256_mul_ps(sy, wx), sw = _mm256_mul_ps(ny, ex),
                 se = _mm256_mul_ps(ny, wx);
    const __m256 lo = _mm256_set1_ps(-2.0f);
    // std::min(std::max(x, -2), f + 1): max_ps(x, lo) is x < lo ? lo : x (no NaN here)
    const __m256i xi = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(x0, lo), _mm256_set1_ps(k.fw + 1.0f)));
    const __m256i yi = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(y0, lo), _mm256_set1_ps(k.fh + 1.0f)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(xi_a), xi);
    _mm256_store_si256(reinterpret_cast<__m256i*>(yi_a), yi);
    _mm256_store_ps(w_a[0], nw);
    _mm256_store_ps(w_a[1], ne);
    _mm256_store_ps(w_a[2], sw);
    _mm256_store_ps(w_a[3], se);
    alignas(32) float m_a[4][8];  // 1 where the neighbour is inside, else 0
    for (int l = 0; l < 8; ++l) {
      const int x = xi_a[l], y = yi_a[l];
      const bool in_w = x >= 0 && x < k.w, in_e = x + 1 >= 0 && x + 1 < k.w;
      const bool in_n = y >= 0 && y < k.h, in_s = y + 1 >= 0 && y + 1 < k.h;
      m_a[0][l] = in_n && in_w ? 1.0f : 0.0f;
      m_a[1][l] = in_n && in_e ? 1.0f : 0.0f;
      m_a[2][l] = in_s && in_w ? 1.0f : 0.0f;
      m_a[3][l] = in_s && in_e ? 1.0f : 0.0f;
    }
    __m256 mask = one;
    if (k.fill_set) {  // in_nw ? nw : 0 is nw · 1 or 0 · … : a select
      mask = _mm256_blendv_ps(_mm256_setzero_ps(), nw, _mm256_cmp_ps(_mm256_load_ps(m_a[0]), one, _CMP_EQ_OQ));
      mask = _mm256_fmadd_ps(_mm256_load_ps(m_a[1]), ne, mask);
      mask = _mm256_fmadd_ps(_mm256_load_ps(m_a[2]), sw, mask);
      mask = _mm256_fmadd_ps(_mm256_load_ps(m_a[3]), se, mask);
    }
    for (int ch = 0; ch < k.channels; ++ch) {
      alignas(32) float p_a[4][8];
      const uint8_t* plane = k.src + ch * k.plane;
      for (int l = 0; l < 8; ++l) {
        const ptrdiff_t at = static_cast<ptrdiff_t>(yi_a[l]) * k.w + xi_a[l];  // read only where inside
        p_a[0][l] = m_a[0][l] != 0.0f ? static_cast<float>(plane[at]) : 0.0f;
        p_a[1][l] = m_a[1][l] != 0.0f ? static_cast<float>(plane[at + 1]) : 0.0f;
        p_a[2][l] = m_a[2][l] != 0.0f ? static_cast<float>(plane[at + k.w]) : 0.0f;
        p_a[3][l] = m_a[3][l] != 0.0f ? static_cast<float>(plane[at + k.w + 1]) : 0.0f;
      }
      __m256 val = _mm256_mul_ps(_mm256_load_ps(p_a[0]), nw);
      val = _mm256_fmadd_ps(_mm256_load_ps(p_a[1]), ne, val);
      val = _mm256_fmadd_ps(_mm256_load_ps(p_a[2]), sw, val);
      val = _mm256_fmadd_ps(_mm256_load_ps(p_a[3]), se, val);
      if (k.fill_set) {
        const __m256 f = _mm256_set1_ps(k.fill_value[ch]);
        val = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(val, f), mask), f);
      }
      // round_even, then to_u8's truncate-and-clamp
      __m256i q = _mm256_cvttps_epi32(_mm256_round_ps(val, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_setzero_si256()), _mm256_set1_epi32(255));
      alignas(32) int q_a[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(q_a), q);
      for (int l = 0; l < 8; ++l) row[static_cast<size_t>(ox0 + l) * k.ps + ch * k.cs] = static_cast<uint8_t>(q_a[l]);
    }
  }
  warp_span(k, oy, blocks * 8, k.w);
}
#endif

void warp(const View& v, const std::array<double, 6>& matrix, Interpolation mode, const Fill& fill) {
  Warp k{};
  k.src = planar_copy(v).data();
  k.out = v.p;
  k.w = v.w;
  k.h = v.h;
  k.channels = v.c;
  k.plane = v.pixels();
  k.cs = v.cs;
  k.ps = v.ps;
  k.nearest = mode == Interpolation::kNearest;
  k.fill_set = fill.set;
  for (int c = 0; c < 3; ++c) k.fill_value[c] = fill.value[static_cast<size_t>(c)];
  const float half_w = static_cast<float>(0.5 * v.w), half_h = static_cast<float>(0.5 * v.h);
  k.a0 = static_cast<float>(matrix[0]) / half_w;
  k.a1 = static_cast<float>(matrix[3]) / half_h;
  k.b0 = static_cast<float>(matrix[1]) / half_w;
  k.b1 = static_cast<float>(matrix[4]) / half_h;
  k.c0 = static_cast<float>(matrix[2]) / half_w;
  k.c1 = static_cast<float>(matrix[5]) / half_h;
  k.scale_x = static_cast<float>(v.w) / 2;
  k.scale_y = static_cast<float>(v.h) / 2;
  k.fw = static_cast<float>(v.w);
  k.fh = static_cast<float>(v.h);
#ifdef CRUCIBLE_WARP_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && vector_warp_allowed) {
    for (int oy = 0; oy < v.h; ++oy) warp_span_avx2(k, oy);
    return;
  }
#endif
  for (int oy = 0; oy < v.h; ++oy) warp_span(k, oy, 0, v.w);
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

namespace {

// One pixel of adjust_hue_image, in float32 as torch computes it (no fused multiply-add: this
// file is built with -ffp-contract=off, and torch's kernels here are separate ops). _rgb_to_hsv
// multiplies its hue terms by 0/1 masks and sums them: the sum is exactly the one term selected,
// so a branch gives the same bits.
inline void hue_pixel(uint8_t* r8, uint8_t* g8, uint8_t* b8, float hue) {
  const float k = static_cast<float>(1.0 / 255.0);  // to_dtype_image: .to(float32).mul_(1 / 255)
  const float r = static_cast<float>(*r8) * k, g = static_cast<float>(*g8) * k, b = static_cast<float>(*b8) * k;
  const float maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
  const bool eqc = maxc == minc;
  const float range = maxc - minc;
  const float s = range / (eqc ? 1.0f : maxc);
  const float div = eqc ? 1.0f : range;
  const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
  float h;
  if (maxc == r) {
    h = bc - gc;
  } else if (maxc == g) {
    h = (rc + 2.0f) - bc;
  } else {
    h = (gc + 4.0f) - rc;
  }
  h = std::fmod(h * static_cast<float>(1.0 / 6.0) + 1.0f, 1.0f);
  // h.add_(hue_factor).remainder_(1.0): Python's modulo, the divisor's sign (a tiny negative
  // sum becomes 1 - ε, which may round to 1.0: hsv_to_rgb's i.remainder_(6) folds it back).
  h = std::fmod(h + hue, 1.0f);
  if (h != 0.0f && h < 0.0f) h += 1.0f;
  // _hsv_to_rgb
  const float h6 = h * 6.0f, fi = std::floor(h6), f = h6 - fi;
  const int i = static_cast<int>(fi) % 6;
  const float v = maxc, sxf = s * f, one_minus_s = 1.0f - s;
  const float q = std::clamp((1.0f - sxf) * v, 0.0f, 1.0f);
  const float t = std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f);
  const float p = std::clamp(one_minus_s * v, 0.0f, 1.0f);
  // select = [[v q p p t v], [t v v q p p], [p p t v v q]] (vpqt indices [[0,2,1,1,3,0], …])
  const float vpqt[4] = {v, p, q, t};
  static constexpr int kSelect[3][6] = {{0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
  // to_dtype_image(float → uint8): .mul(255 + 1 - 1e-3).to(uint8), truncation
  const float scale = static_cast<float>(255.0 + 1.0 - 1e-3);
  *r8 = to_u8(vpqt[kSelect[0][i]] * scale);
  *g8 = to_u8(vpqt[kSelect[1][i]] * scale);
  *b8 = to_u8(vpqt[kSelect[2][i]] * scale);
}

}  // namespace

void adjust_hue(ImageRef image, double hue_factor) {
  check_channels(image, "adjust_hue");
  if (!(hue_factor >= -0.5 && hue_factor <= 0.5)) {
    throw bad_input("hue_factor must be in [-0.5, 0.5], found {}", hue_factor);
  }
  if (image.channels == 1) return;  // as PIL
  const View v(image);
  const float hue = static_cast<float>(hue_factor);
  const size_t n = v.pixels(), cs = v.cs, ps = v.ps;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* px = v.p + i * ps;
    hue_pixel(px, px + cs, px + 2 * cs, hue);
  }
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

void testing::set_vector_warp(bool allowed) { vector_warp_allowed = allowed; }

}  // namespace crucible::data::ops
