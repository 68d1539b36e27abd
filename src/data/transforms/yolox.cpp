// YOLOX's pipeline (see yolox.h): its functions in YOLOX's order of operations and float64 box
// arithmetic, the preset's two transforms and their settings. The pixels go through OpenCV's
// arithmetic (yolox_opencv.cpp). Compiled with -ffp-contract=off: numpy multiplies and adds
// apart, and the one fused product below (the corners' matrix product) is OpenBLAS's.
#include "crucible/data/transforms/yolox.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/data/transforms/transform.h"

namespace crucible::data {

void declare_settings(ConfigSchema& s, YoloxSettings& o) {
  s.add("data", "yolox_size", &o.size,
        "yolox preset: the input size, square (exp's input_size); images are letterboxed to it with 114, mosaic's "
        "canvas is twice it")
      .min(32)
      .max(1 << 14);
  s.add("data", "yolox_mosaic_epochs", &o.mosaic_epochs,
        "yolox preset: the epochs (from 0) that use mosaic and mixup; later ones run TrainTransform alone. YOLOX turns "
        "mosaic off at epoch max_epoch - no_aug_epochs - 1: 284 for its 300 epochs with no_aug_epochs 15")
      .min(0);
  s.add("data", "yolox_mosaic_prob", &o.mosaic_prob, "yolox preset: the probability of mosaic (mosaic_prob)")
      .min(0)
      .max(1)
      .arg("mosaic_prob");
  s.add("data", "yolox_mixup", &o.mixup, "yolox preset: MixUp after mosaic (enable_mixup)").arg("enable_mixup");
  s.add("data", "yolox_mixup_prob", &o.mixup_prob, "yolox preset: the probability of MixUp (mixup_prob)")
      .min(0)
      .max(1)
      .arg("mixup_prob");
  s.add("data", "yolox_hsv_prob", &o.hsv_prob, "yolox preset: the probability of the HSV jitter (hsv_prob)")
      .min(0)
      .max(1)
      .arg("hsv_prob");
  s.add("data", "yolox_degrees", &o.degrees, "yolox preset: random_affine's rotation, ±degrees").min(0).max(180).arg("degrees");
  s.add("data", "yolox_translate", &o.translate, "yolox preset: random_affine's translation, ± this fraction of the size")
      .min(0)
      .max(1)
      .arg("translate");
  s.add("data", "yolox_mosaic_scale", &o.mosaic_scale, "yolox preset: random_affine's scale range [min, max] (mosaic_scale)")
      .positive()
      .arg("mosaic_scale");
  s.add("data", "yolox_mixup_scale", &o.mixup_scale, "yolox preset: MixUp's scale jitter range [min, max] (mixup_scale)")
      .positive()
      .arg("mixup_scale");
  s.add("data", "yolox_shear", &o.shear, "yolox preset: random_affine's shear, ±degrees on each axis").min(0).max(89).arg("shear");
  s.add("data", "yolox_max_labels", &o.max_labels,
        "yolox preset: the most boxes a training image keeps, the first ones (TrainTransform's max_labels)")
      .min(1)
      .arg("max_labels");
}

void YoloxSample::keep(const std::vector<uint8_t>& k) {
  size_t n = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    if (k[i] == 0) continue;
    std::copy(&xyxy[4 * i], &xyxy[4 * i] + 4, &xyxy[4 * n]);
    labels[n] = labels[i], ids[n] = ids[i], iscrowd[n] = iscrowd[i];
    ++n;
  }
  xyxy.resize(4 * n), labels.resize(n), ids.resize(n), iscrowd.resize(n);
}

YoloxSample to_yolox(DetectionImage s) {
  if (s.channels != 3) throw bad_input("yolox: expected a 3-channel image, found {} channels", s.channels);
  YoloxSample y;
  y.pixels = std::move(s.pixels);
  y.width = s.width, y.height = s.height;
  y.xyxy.assign(s.boxes.xyxy.begin(), s.boxes.xyxy.end());
  y.labels = s.boxes.labels, y.ids = s.boxes.ids, y.iscrowd = s.boxes.iscrowd;
  return y;
}

DetectionImage from_yolox(YoloxSample y) {
  DetectionImage s;
  s.pixels = std::move(y.pixels);
  s.width = y.width, s.height = y.height, s.channels = 3;
  for (size_t i = 0; i < y.size(); ++i) {
    const double* b = &y.xyxy[4 * i];
    s.boxes.add(static_cast<float>(b[0]), static_cast<float>(b[1]), static_cast<float>(b[2]), static_cast<float>(b[3]),
                y.labels[i], y.iscrowd[i] != 0, y.ids[i]);
  }
  return s;
}

double StreamDraws::keep(double v) {
  if (record_ != nullptr) record_->push_back(v);
  return v;
}

double StreamDraws::random() { return keep(rng_.uniform()); }

double StreamDraws::uniform(double lo, double hi) { return keep(lo + (hi - lo) * static_cast<double>(rng_.uniform())); }

int64_t StreamDraws::randint(int64_t lo, int64_t hi) {
  if (hi < lo) throw bad_input("randint({}, {}): empty range", lo, hi);
  const uint64_t n = static_cast<uint64_t>(hi - lo) + 1;
  // 64 bits from two draws; the top of the range where n does not divide 2^64 drawn again: no bias.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t limit = n == 0 ? max : max - max % n;
  for (;;) {
    const uint64_t high = rng_.next_u32();  // two statements: the order of the two draws is fixed
    const uint64_t v = (high << 32) | rng_.next_u32();
    if (v < limit || n == 0) {
      const int64_t out = lo + static_cast<int64_t>(n == 0 ? v : v % n);
      keep(static_cast<double>(out));
      return out;
    }
  }
}

double ReplayDraws::next(const char* what) {
  if (used_ >= values_.size()) throw bad_input("yolox draws: {} asked for value {} of {} given", what, used_ + 1, values_.size());
  return values_[used_++];
}

int64_t ReplayDraws::randint(int64_t lo, int64_t hi) {
  const double v = next("randint");
  if (v != std::floor(v) || v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
    throw bad_input("yolox draws: randint({}, {}) given {}", lo, hi, v);
  }
  return static_cast<int64_t>(v);
}

namespace yolox {
namespace {

constexpr uint8_t kFill = 114;  // YOLOX's pad and border level
constexpr double kPi = 3.1415926535897932384626433832795;  // CV_PI and math.pi

void check_input(int input_h, int input_w, const char* what) {
  if (input_h < 1 || input_w < 1) throw bad_input("yolox {}: input size {}x{} must be at least 1x1", what, input_w, input_h);
}

// The image resized by r = min(input_h / h, input_w / w) to (int(w r), int(h r)), as fit and preproc
// do; the boxes untouched. Returns r.
double resize_fitting(YoloxSample& s, int input_h, int input_w, const char* what) {
  check_input(input_h, input_w, what);
  const double r = std::min(static_cast<double>(input_h) / s.height, static_cast<double>(input_w) / s.width);
  const int w = static_cast<int>(s.width * r), h = static_cast<int>(s.height * r);
  if (w < 1 || h < 1) {
    throw bad_input("yolox {}: a {}x{} image scaled by {} to fit {}x{} is empty", what, s.width, s.height, r, input_w, input_h);
  }
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 3);
  cv4::resize_linear(s.pixels.data(), s.width, s.height, 3, out.data(), w, h);
  s.pixels = std::move(out);
  s.width = w, s.height = h;
  return r;
}

void scale_boxes(YoloxSample& s, double r) {
  for (double& v : s.xyxy) v *= r;
}

// preproc's image: fitted, at the top left of an input_h × input_w canvas of 114. Returns r.
double letterbox_image(YoloxSample& s, int input_h, int input_w) {
  // An image of the input's size is its own letterbox (r = 1: the resize copies, the canvas is
  // covered): no pass at all. After mosaic and random_affine every training image is one.
  if (s.width == input_w && s.height == input_h) return 1.0;
  const double r = resize_fitting(s, input_h, input_w, "preproc");
  std::vector<uint8_t> canvas(static_cast<size_t>(input_w) * input_h * 3, kFill);
  for (int y = 0; y < s.height; ++y) {
    std::copy_n(&s.pixels[static_cast<size_t>(y) * s.width * 3], static_cast<size_t>(s.width) * 3,
                &canvas[static_cast<size_t>(y) * input_w * 3]);
  }
  s.pixels = std::move(canvas);
  s.width = input_w, s.height = input_h;
  return r;
}

// Copies rows [sy1, sy2) × columns [sx1, sx2) of src (src_w wide) into dst at (dx1, dy1), 3 channels.
void paste(const uint8_t* src, int src_w, int sx1, int sy1, int sx2, int sy2, std::vector<uint8_t>& dst, int dst_w,
           int dx1, int dy1) {
  for (int y = sy1; y < sy2; ++y) {
    std::copy_n(src + (static_cast<size_t>(y) * src_w + sx1) * 3, static_cast<size_t>(sx2 - sx1) * 3,
                &dst[(static_cast<size_t>(dy1 + y - sy1) * dst_w + dx1) * 3]);
  }
}

void append_boxes(YoloxSample& to, const YoloxSample& from) {
  to.xyxy.insert(to.xyxy.end(), from.xyxy.begin(), from.xyxy.end());
  to.labels.insert(to.labels.end(), from.labels.begin(), from.labels.end());
  to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
  to.iscrowd.insert(to.iscrowd.end(), from.iscrowd.begin(), from.iscrowd.end());
}

void clip_boxes(YoloxSample& s, double w, double h) {
  for (size_t i = 0; i < s.xyxy.size(); ++i) s.xyxy[i] = std::clamp(s.xyxy[i], 0.0, i % 2 == 0 ? w : h);
}

}  // namespace

void fit(YoloxSample& s, int input_h, int input_w) { scale_boxes(s, resize_fitting(s, input_h, input_w, "pull_item")); }

double letterbox(YoloxSample& s, int input_h, int input_w) {
  const double r = letterbox_image(s, input_h, input_w);
  scale_boxes(s, r);
  return r;
}

void augment_hsv(YoloxSample& s, const std::array<int, 3>& gains) { cv4::hsv_jitter(s.pixels.data(), s.width, s.height, gains); }

std::array<int, 3> draw_hsv_gains(YoloxDraws& draws, const std::array<double, 3>& gain, std::array<double, 3>* uniform_out,
                                  std::array<int, 3>* select_out) {
  std::array<double, 3> u{};
  std::array<int, 3> sel{}, gains{};
  for (double& v : u) v = draws.uniform(-1, 1);
  for (int& v : sel) v = static_cast<int>(draws.randint(0, 1));
  for (int c = 0; c < 3; ++c) gains[c] = static_cast<int>(std::trunc(u[c] * gain[c] * sel[c]));  // astype(np.int16)
  if (uniform_out != nullptr) *uniform_out = u;
  if (select_out != nullptr) *select_out = sel;
  return gains;
}

void mirror(YoloxSample& s) {
  hflip_image(s.pixels.data(), s.width, s.height, 3);
  const auto w = static_cast<double>(s.width);
  for (size_t i = 0; i < s.size(); ++i) {
    double* b = &s.xyxy[4 * i];
    const double x1 = w - b[2], x2 = w - b[0];
    b[0] = x1, b[2] = x2;
  }
}

AffineParams draw_affine(YoloxDraws& draws, double degrees, double translate, double scale_lo, double scale_hi,
                         double shear) {
  // get_affine_matrix's order: angle, scale, shear_x, shear_y, translation x, translation y.
  AffineParams p;
  p.angle = draws.uniform(-degrees, degrees);
  p.scale = draws.uniform(scale_lo, scale_hi);
  p.shear_x = draws.uniform(-shear, shear);
  p.shear_y = draws.uniform(-shear, shear);
  p.translate_x = draws.uniform(-translate, translate);
  p.translate_y = draws.uniform(-translate, translate);
  return p;
}

std::array<double, 6> affine_matrix(const AffineParams& p, int target_w, int target_h) {
  if (!(p.scale > 0)) throw bad_input("yolox random_affine: scale = {} must be positive", p.scale);
  // cv2.getRotationMatrix2D(center=(0, 0), angle, scale): angle *= CV_PI/180.
  const double angle = p.angle * (kPi / 180);
  const double alpha = std::cos(angle) * p.scale, beta = std::sin(angle) * p.scale;
  const double shear_x = std::tan(p.shear_x * kPi / 180), shear_y = std::tan(p.shear_y * kPi / 180);
  // M[0] = R[0] + shear_y * R[1]; M[1] = R[1] + shear_x * R[0]; then the translations.
  return {alpha + shear_y * -beta,     beta + shear_y * alpha,  p.translate_x * target_w,
          -beta + shear_x * alpha,     alpha + shear_x * beta,  p.translate_y * target_h};
}

void random_affine(YoloxSample& s, const AffineParams& p, int target_w, int target_h) {
  check_input(target_h, target_w, "random_affine");
  const std::array<double, 6> m = affine_matrix(p, target_w, target_h);
  std::vector<uint8_t> out(static_cast<size_t>(target_w) * target_h * 3);
  const uint8_t border[3] = {kFill, kFill, kFill};
  cv4::warp_affine(s.pixels.data(), s.width, s.height, out.data(), target_w, target_h, m.data(), border);
  s.pixels = std::move(out);
  s.width = target_w, s.height = target_h;
  // apply_affine_to_bboxes: corners x1y1, x2y2, x1y2, x2y1 (with a 1) @ M.T. numpy's product is
  // OpenBLAS's dgemm, which accumulates x·m0, then y·m1 fused, then the translation.
  for (size_t i = 0; i < s.size(); ++i) {
    double* b = &s.xyxy[4 * i];
    const double cx[4] = {b[0], b[2], b[0], b[2]}, cy[4] = {b[1], b[3], b[3], b[1]};
    double lo_x = 0, hi_x = 0, lo_y = 0, hi_y = 0;
    for (int k = 0; k < 4; ++k) {
      const double x = std::fma(cy[k], m[1], cx[k] * m[0]) + m[2];
      const double y = std::fma(cy[k], m[4], cx[k] * m[3]) + m[5];
      lo_x = k == 0 ? x : std::min(lo_x, x), hi_x = k == 0 ? x : std::max(hi_x, x);
      lo_y = k == 0 ? y : std::min(lo_y, y), hi_y = k == 0 ? y : std::max(hi_y, y);
    }
    b[0] = lo_x, b[1] = lo_y, b[2] = hi_x, b[3] = hi_y;
  }
  clip_boxes(s, target_w, target_h);
}

YoloxSample mosaic(const std::array<const YoloxSample*, 4>& tiles, int xc, int yc, int input_h, int input_w) {
  check_input(input_h, input_w, "mosaic");
  YoloxSample m;
  m.width = 2 * input_w, m.height = 2 * input_h;
  m.pixels.assign(static_cast<size_t>(m.width) * m.height * 3, kFill);
  for (int i = 0; i < 4; ++i) {
    const YoloxSample& t = *tiles[i];
    const double scale = std::min(1. * input_h / t.height, 1. * input_w / t.width);
    const int w = static_cast<int>(t.width * scale), h = static_cast<int>(t.height * scale);
    if (w < 1 || h < 1) throw bad_input("yolox mosaic: a {}x{} tile scaled by {} is empty", t.width, t.height, scale);
    std::vector<uint8_t> resized;
    const uint8_t* img = t.pixels.data();
    if (w != t.width || h != t.height) {
      resized.resize(static_cast<size_t>(w) * h * 3);
      cv4::resize_linear(t.pixels.data(), t.width, t.height, 3, resized.data(), w, h);
      img = resized.data();
    }
    // get_mosaic_coordinate: the canvas rectangle (l) and the tile's (s) of quadrant i.
    int lx1, ly1, lx2, ly2, sx1, sy1, sx2, sy2;
    if (i == 0) {
      lx1 = std::max(xc - w, 0), ly1 = std::max(yc - h, 0), lx2 = xc, ly2 = yc;
      sx1 = w - (lx2 - lx1), sy1 = h - (ly2 - ly1), sx2 = w, sy2 = h;
    } else if (i == 1) {
      lx1 = xc, ly1 = std::max(yc - h, 0), lx2 = std::min(xc + w, input_w * 2), ly2 = yc;
      sx1 = 0, sy1 = h - (ly2 - ly1), sx2 = std::min(w, lx2 - lx1), sy2 = h;
    } else if (i == 2) {
      lx1 = std::max(xc - w, 0), ly1 = yc, lx2 = xc, ly2 = std::min(input_h * 2, yc + h);
      sx1 = w - (lx2 - lx1), sy1 = 0, sx2 = w, sy2 = std::min(ly2 - ly1, h);
    } else {
      lx1 = xc, ly1 = yc, lx2 = std::min(xc + w, input_w * 2), ly2 = std::min(input_h * 2, yc + h);
      sx1 = 0, sy1 = 0, sx2 = std::min(w, lx2 - lx1), sy2 = std::min(ly2 - ly1, h);
    }
    if (sx2 > sx1 && sy2 > sy1) paste(img, w, sx1, sy1, sx2, sy2, m.pixels, m.width, lx1, ly1);
    const int padw = lx1 - sx1, padh = ly1 - sy1;
    const size_t first = m.xyxy.size();
    append_boxes(m, t);
    for (size_t k = first; k < m.xyxy.size(); ++k) m.xyxy[k] = scale * m.xyxy[k] + ((k - first) % 2 == 0 ? padw : padh);
  }
  clip_boxes(m, 2.0 * input_w, 2.0 * input_h);
  return m;
}

void draw_mixup_offsets(YoloxDraws& draws, MixupParams* p, int input_h, int input_w, int target_h, int target_w) {
  const int h = std::max(static_cast<int>(input_h * p->jit), target_h), w = std::max(static_cast<int>(input_w * p->jit), target_w);
  p->y_offset = h > target_h ? static_cast<int>(draws.randint(0, h - target_h - 1)) : 0;
  p->x_offset = w > target_w ? static_cast<int>(draws.randint(0, w - target_w - 1)) : 0;
}

void mixup(YoloxSample& origin, YoloxSample cp, const MixupParams& p, int input_h, int input_w) {
  double ratio = letterbox_image(cp, input_h, input_w);  // cp_img: 114, the image at its top left
  const int ow = static_cast<int>(input_w * p.jit), oh = static_cast<int>(input_h * p.jit);
  if (ow < 1 || oh < 1) throw bad_input("yolox mixup: jit_factor {} leaves no image", p.jit);
  std::vector<uint8_t> jittered(static_cast<size_t>(ow) * oh * 3);
  cv4::resize_linear(cp.pixels.data(), cp.width, cp.height, 3, jittered.data(), ow, oh);
  cp.pixels = std::move(jittered);
  cp.width = ow, cp.height = oh;
  ratio *= p.jit;
  if (p.flip) hflip_image(cp.pixels.data(), ow, oh, 3);
  const int th = origin.height, tw = origin.width;
  const int ph = std::max(oh, th), pw = std::max(ow, tw);
  if (p.y_offset < 0 || p.x_offset < 0 || p.y_offset + th > ph || p.x_offset + tw > pw) {
    throw bad_input("yolox mixup: offset ({}, {}) outside the {}x{} padded image", p.x_offset, p.y_offset, pw, ph);
  }
  // padded_img (zeros) cropped at the offsets, blended: 0.5 a + 0.5 b in float32 is exact, and
  // astype(uint8) truncates it.
  for (int y = 0; y < th; ++y) {
    const int sy = y + p.y_offset;
    uint8_t* a = &origin.pixels[static_cast<size_t>(y) * tw * 3];
    // The part of the row over the jittered image, then the part over its zero padding.
    const size_t over = sy < oh ? static_cast<size_t>(std::clamp(ow - p.x_offset, 0, tw)) * 3 : 0;
    const uint8_t* b = sy < oh ? &cp.pixels[(static_cast<size_t>(sy) * ow + p.x_offset) * 3] : nullptr;
    for (size_t i = 0; i < over; ++i) a[i] = static_cast<uint8_t>((a[i] + b[i]) >> 1);
    for (size_t i = over; i < static_cast<size_t>(tw) * 3; ++i) a[i] = static_cast<uint8_t>(a[i] >> 1);
  }
  // adjust_box_anns(boxes, cp_scale_ratio, 0, 0, origin_w, origin_h), the flip, the crop.
  for (size_t i = 0; i < cp.size(); ++i) {
    double* b = &cp.xyxy[4 * i];
    for (int k = 0; k < 4; ++k) b[k] = std::clamp(b[k] * ratio + 0, 0.0, static_cast<double>(k % 2 == 0 ? ow : oh));
    if (p.flip) {
      const double x1 = ow - b[2], x2 = ow - b[0];
      b[0] = x1, b[2] = x2;
    }
    for (int k = 0; k < 4; ++k) {
      b[k] = k % 2 == 0 ? std::clamp(b[k] - p.x_offset, 0.0, static_cast<double>(tw))
                        : std::clamp(b[k] - p.y_offset, 0.0, static_cast<double>(th));
    }
  }
  append_boxes(origin, cp);
}

TrainParams draw_train(YoloxDraws& draws, const YoloxSample& s, double hsv_prob, double flip_prob) {
  TrainParams p;
  if (s.size() == 0) return p;
  p.hsv = draws.random() < hsv_prob;
  if (p.hsv) p.gains = draw_hsv_gains(draws, {5, 30, 30}, &p.hsv_uniform, &p.hsv_select);
  p.flip = draws.random() < flip_prob;
  return p;
}

void train_transform(YoloxSample& s, const TrainParams& p, int input_h, int input_w, int max_labels) {
  if (s.size() == 0) {
    letterbox(s, input_h, input_w);
    return;
  }
  // The boxes kept: xyxy2cxcywh of the (flipped) boxes, × r, min(w, h) > 1. Known before the
  // image is touched, so that the sample as it came needs no copy.
  const double r = std::min(static_cast<double>(input_h) / s.height, static_cast<double>(input_w) / s.width);
  const auto width = static_cast<double>(s.width);
  std::vector<uint8_t> keep(s.size());
  bool any = false;
  for (size_t i = 0; i < keep.size(); ++i) {
    const double* b = &s.xyxy[4 * i];
    const double w = p.flip ? (width - b[0]) - (width - b[2]) : b[2] - b[0];
    keep[i] = std::min(w * r, (b[3] - b[1]) * r) > 1;
    any = any || keep[i] != 0;
  }
  if (any) {
    if (p.hsv) augment_hsv(s, p.gains);
    if (p.flip) mirror(s);
    letterbox_image(s, input_h, input_w);
    s.keep(keep);
    scale_boxes(s, r);
  } else {  // none left: the sample as it came, every box kept
    letterbox(s, input_h, input_w);
  }
  if (s.size() > static_cast<size_t>(max_labels)) {
    std::vector<uint8_t> first(s.size(), 0);
    std::fill_n(first.begin(), max_labels, 1);
    s.keep(first);
  }
}

}  // namespace yolox

namespace {

// COCODataset.pull_item: the annotations without crowd regions, the image fitted.
YoloxSample pulled(DetectionImage s, int size) {
  YoloxSample y = to_yolox(std::move(s));
  std::vector<uint8_t> keep(y.size());
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = y.iscrowd[i] == 0;
  y.keep(keep);
  yolox::fit(y, size, size);
  return y;
}

void check_range(const std::vector<double>& range, const char* key) {
  if (range.size() != 2 || !(range[0] > 0) || !(range[0] <= range[1])) {
    throw bad_input("{} = [{}]: expected [min, max] with 0 < min <= max", key, fmt::join(range, ", "));
  }
}

}  // namespace

YoloxTrain::YoloxTrain(YoloxSettings settings, double flip_prob) : o_(std::move(settings)), flip_prob_(flip_prob) {
  check_range(o_.mosaic_scale, "data.yolox_mosaic_scale");
  check_range(o_.mixup_scale, "data.yolox_mixup_scale");
  if (o_.size < 1) throw bad_input("data.yolox_size = {}: expected at least 1", o_.size);
  if (!(flip_prob >= 0 && flip_prob <= 1)) throw bad_input("data.hflip = {}: expected 0 <= p <= 1", flip_prob);
}

void YoloxTrain::apply(DetectionImage&, SampleRng&) const {
  throw std::logic_error("the yolox training transform reads other samples: run it in a DetectionPipeline");
}

YoloxSample YoloxTrain::mosaic_and_mix(YoloxSample s, YoloxDraws& draws, const DetectionContext& context) const {
  const int size = static_cast<int>(o_.size);
  if (context.size < 1 || !context.load) throw std::logic_error("yolox mosaic: no data set to draw from");
  // yc before xc, then the three other samples: MosaicDetection.__getitem__'s order.
  const int yc = static_cast<int>(draws.uniform(0.5 * size, 1.5 * size));
  const int xc = static_cast<int>(draws.uniform(0.5 * size, 1.5 * size));
  std::array<YoloxSample, 3> others;
  for (YoloxSample& o : others) o = pulled(context.load(draws.randint(0, context.size - 1)), size);
  YoloxSample m = yolox::mosaic({&s, &others[0], &others[1], &others[2]}, xc, yc, size, size);
  yolox::random_affine(m, yolox::draw_affine(draws, o_.degrees, o_.translate, o_.mosaic_scale[0], o_.mosaic_scale[1], o_.shear),
                       size, size);
  if (!o_.mixup || m.size() == 0 || !(draws.random() < o_.mixup_prob)) return m;
  yolox::MixupParams p;
  p.jit = draws.uniform(o_.mixup_scale[0], o_.mixup_scale[1]);
  p.flip = draws.uniform(0, 1) > 0.5;
  // A sample with boxes, drawn again until one has (YOLOX loops without end; a data set without
  // a box anywhere would hang it).
  YoloxSample other;
  for (int tries = 0; other.size() == 0; ++tries) {
    if (tries == 10000) throw bad_input("yolox mixup: 10000 samples drawn and none has a box (does the data set hold any?)");
    other = pulled(context.load(draws.randint(0, context.size - 1)), size);
  }
  yolox::draw_mixup_offsets(draws, &p, size, size, m.height, m.width);
  yolox::mixup(m, std::move(other), p, size, size);
  return m;
}

void YoloxTrain::apply(DetectionImage& sample, SampleRng& rng, const DetectionContext& context) const {
  StreamDraws draws(rng);
  run(sample, draws, context);
}

void YoloxTrain::run(DetectionImage& sample, YoloxDraws& draws, const DetectionContext& context) const {
  const int size = static_cast<int>(o_.size);
  YoloxSample s = pulled(std::move(sample), size);
  // `self.enable_mosaic and random.random() < self.mosaic_prob`: no draw once mosaic is off.
  if (context.epoch < o_.mosaic_epochs && draws.random() < o_.mosaic_prob) s = mosaic_and_mix(std::move(s), draws, context);
  const yolox::TrainParams p = yolox::draw_train(draws, s, o_.hsv_prob, flip_prob_);
  yolox::train_transform(s, p, size, size, static_cast<int>(o_.max_labels));
  sample = from_yolox(std::move(s));
}

std::string YoloxTrain::describe() const {
  return fmt::format("yolox: mosaic (p={}, epochs < {}) + random_affine + mixup (p={}), hsv (p={}), flip (p={}), "
                     "letterbox {}",
                     o_.mosaic_prob, o_.mosaic_epochs, o_.mixup ? o_.mixup_prob : 0.0, o_.hsv_prob, flip_prob_, o_.size);
}

YoloxLetterbox::YoloxLetterbox(int size) : size_(size) {
  if (size < 1) throw bad_input("data.yolox_size = {}: expected at least 1", size);
}

void YoloxLetterbox::apply(DetectionImage& sample, SampleRng&) const {
  YoloxSample s = to_yolox(std::move(sample));
  yolox::fit(s, size_, size_);
  yolox::letterbox(s, size_, size_);
  sample = from_yolox(std::move(s));
}

std::string YoloxLetterbox::describe() const { return fmt::format("yolox letterbox {} (fill 114)", size_); }

}  // namespace crucible::data
