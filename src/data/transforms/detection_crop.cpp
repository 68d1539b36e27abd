// RandomIoUCrop and RandomZoomOut (see detection_crop.h): torchvision.transforms.v2's
// make_params decision by decision and its transform's arithmetic (float32 where torch computes
// in float32: a Python number against a float32 tensor is cast to float32 first).
#include "crucible/data/transforms/detection_crop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "crucible/core/error.h"

namespace crucible::data {
namespace {

// "[a, b, …]" of a setting's values, for its error.
std::string list(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += (out.empty() ? "" : ", ") + fmt::format("{}", x);
  return "[" + out + "]";
}

}  // namespace

namespace detection {
namespace {

// torch.randint(0, n): one 32-bit draw reduced modulo n (random_from_to on the CPU generator).
size_t draw_index(SampleRng& rng, size_t n) {
  return rng.next_u32() % static_cast<uint32_t>(n);
}

// box_iou(box, [[left, top, right, bottom]]) in float32, as torchvision.ops computes it. A NaN
// coordinate stays NaN (std::max/min with the box first, as torch.max/min propagate it).
float iou(const float* b, float left, float top, float right, float bottom) {
  const float area1 = (b[2] - b[0]) * (b[3] - b[1]);
  const float area2 = (right - left) * (bottom - top);
  const float w = std::max(std::min(b[2], right) - std::max(b[0], left), 0.0f);
  const float h = std::max(std::min(b[3], bottom) - std::max(b[1], top), 0.0f);
  const float inter = w * h;
  return inter / (area1 + area2 - inter);
}

// One trial of make_params' inner loop for the minimum IoU `min_iou`: true with `out` set when
// the crop it draws is kept. The draws and the order of the checks are v2's, so a trial rejected
// after its scale draw makes no position draw.
bool try_crop(const DetectionImage& s, SampleRng& rng, const IoUCropOptions& o, double min_iou, IoUCrop* out) {
  // r = min_scale + (max_scale - min_scale) * torch.rand(2): the Python numbers cast to float32.
  const auto lo = static_cast<float>(o.min_scale), span = static_cast<float>(o.max_scale - o.min_scale);
  const float r0 = lo + span * rng.uniform();
  const float r1 = lo + span * rng.uniform();
  const auto new_w = static_cast<int>(static_cast<float>(s.width) * r0);
  const auto new_h = static_cast<int>(static_cast<float>(s.height) * r1);
  // v2 divides by new_h unchecked (ZeroDivisionError for an image under 1 / min_scale pixels
  // high); here that crop is rejected like one of the wrong aspect.
  if (new_h == 0) return false;
  const double aspect = static_cast<double>(new_w) / new_h;
  if (!(o.min_aspect_ratio <= aspect && aspect <= o.max_aspect_ratio)) return false;

  const float u0 = rng.uniform(), u1 = rng.uniform();
  const auto left = static_cast<int>(static_cast<float>(s.width - new_w) * u0);
  const auto top = static_cast<int>(static_cast<float>(s.height - new_h) * u1);
  const int right = left + new_w, bottom = top + new_h;
  if (left == right || top == bottom) return false;

  std::vector<uint8_t> within = centres_within(s.boxes, left, top, right, bottom);
  // ious.max() < min_iou rejects: a NaN IoU makes the max NaN, which keeps the crop.
  const auto threshold = static_cast<float>(min_iou);
  bool any = false, reaches = false;
  for (size_t i = 0; i < within.size(); ++i) {
    if (!within[i]) continue;
    any = true;
    const float v = iou(&s.boxes.xyxy[4 * i], static_cast<float>(left), static_cast<float>(top),
                        static_cast<float>(right), static_cast<float>(bottom));
    reaches = reaches || !(v < threshold);
  }
  if (!any || !reaches) return false;
  out->crop = true;
  out->top = top, out->left = left, out->height = new_h, out->width = new_w;
  out->within = std::move(within);
  return true;
}

}  // namespace

void check(const IoUCropOptions& o) {
  // max_scale <= 1 keeps every crop inside the image (v2 would pad a larger one with zeros).
  if (!(o.min_scale > 0 && o.min_scale <= o.max_scale && o.max_scale <= 1)) {
    throw bad_input("random IoU crop: min_scale = {}, max_scale = {}: expected 0 < min_scale <= max_scale <= 1",
                    o.min_scale, o.max_scale);
  }
  if (!(o.min_aspect_ratio > 0 && o.min_aspect_ratio <= o.max_aspect_ratio)) {
    throw bad_input("random IoU crop: min_aspect_ratio = {}, max_aspect_ratio = {}: expected 0 < min <= max",
                    o.min_aspect_ratio, o.max_aspect_ratio);
  }
  if (o.trials < 1) throw bad_input("random IoU crop: trials = {}: expected at least 1", o.trials);
  // v2 draws options until a crop is found: with no leave-as-is option (>= 1) an image that no
  // crop fits (one without boxes) would be searched for ever.
  if (o.sampler_options.empty() ||
      std::none_of(o.sampler_options.begin(), o.sampler_options.end(), [](double v) { return v >= 1.0; })) {
    throw bad_input(
        "random IoU crop: sampler_options = {}: expected a leave-as-is option (a value >= 1), without "
        "which an image without boxes is searched for ever",
        list(o.sampler_options));
  }
}

IoUCrop draw_iou_crop(const DetectionImage& s, SampleRng& rng, const IoUCropOptions& o) {
  IoUCrop out;
  for (int64_t round = 1;; ++round) {
    out.option = static_cast<int64_t>(draw_index(rng, o.sampler_options.size()));
    out.rounds = round;
    const double min_iou = o.sampler_options[static_cast<size_t>(out.option)];
    if (min_iou >= 1.0) return out;  // leave as is
    // Without boxes every trial fails (no centre inside): skipping them draws the next option
    // as v2 would, only sooner.
    if (s.boxes.empty()) continue;
    for (int64_t t = 0; t < o.trials; ++t) {
      if (try_crop(s, rng, o, min_iou, &out)) return out;
    }
  }
}

std::vector<uint8_t> centres_within(const Boxes& boxes, int left, int top, int right, int bottom) {
  const auto l = static_cast<float>(left), t = static_cast<float>(top);
  const auto r = static_cast<float>(right), b = static_cast<float>(bottom);
  std::vector<uint8_t> within(boxes.size());
  for (size_t i = 0; i < within.size(); ++i) {
    const float* x = &boxes.xyxy[4 * i];
    const float cx = 0.5f * (x[0] + x[2]), cy = 0.5f * (x[1] + x[3]);
    within[i] = l < cx && cx < r && t < cy && cy < b;
  }
  return within;
}

void iou_crop(DetectionImage& s, int top, int left, int height, int width, const std::vector<uint8_t>& within) {
  if (top < 0 || left < 0 || height < 1 || width < 1 || top + height > s.height || left + width > s.width) {
    throw bad_input("random IoU crop: crop top {} left {} {}x{} (width x height) is not inside the {}x{} image", top,
                    left, width, height, s.width, s.height);
  }
  if (within.size() != s.boxes.size()) {
    throw bad_input("random IoU crop: is_within_crop_area has {} values for {} boxes", within.size(), s.boxes.size());
  }
  const size_t row = static_cast<size_t>(width) * s.channels;
  std::vector<uint8_t> out(row * height);
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = &s.pixels[(static_cast<size_t>(top + y) * s.width + left) * s.channels];
    std::memcpy(&out[row * y], src, row);
  }
  s.pixels = std::move(out);
  s.width = width, s.height = height;
  // crop_bounding_boxes: boxes - [left, top, left, top] in float32, clamped to the crop.
  const auto l = static_cast<float>(left), t = static_cast<float>(top);
  for (size_t i = 0; i < s.boxes.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    b[0] -= l, b[1] -= t, b[2] -= l, b[3] -= t;
  }
  clamp_boxes(s);
  s.boxes.keep(within);
}

void check(const ZoomOutOptions& o) {
  if (o.fill.empty() || std::any_of(o.fill.begin(), o.fill.end(), [](double v) { return !(v >= 0 && v < 256); })) {
    throw bad_input(
        "random zoom out: fill = {}: expected one value or one per channel, each in [0, 256) (a uint8 "
        "image is filled with its integer part)",
        list(o.fill));
  }
  if (!(o.side_min >= 1 && o.side_min <= o.side_max && std::isfinite(o.side_max))) {
    throw bad_input("random zoom out: side_range = [{}, {}]: expected 1 <= min <= max", o.side_min, o.side_max);
  }
  if (!(o.p >= 0 && o.p <= 1)) throw bad_input("random zoom out: p = {}: expected 0 <= p <= 1", o.p);
}

ZoomOut draw_zoom_out(const DetectionImage& s, SampleRng& rng, const ZoomOutOptions& o) {
  ZoomOut out;
  // _RandomApplyTransform.forward: torch.rand(1) >= p leaves the sample as it is (p as float32).
  if (!(rng.uniform() < static_cast<float>(o.p))) return out;
  out.zoom = true;
  // r = side_range[0] + torch.rand(1) * (side_range[1] - side_range[0]), in float32.
  const float r = static_cast<float>(o.side_min) + rng.uniform() * static_cast<float>(o.side_max - o.side_min);
  const float fw = static_cast<float>(s.width) * r, fh = static_cast<float>(s.height) * r;
  if (!(fw < 65536.0f && fh < 65536.0f)) {
    throw bad_input("random zoom out: side_range = [{}, {}] makes a {}x{} image {}x{}: expected at most 65535 a side",
                    o.side_min, o.side_max, s.width, s.height, fw, fh);
  }
  const auto canvas_w = static_cast<int>(fw), canvas_h = static_cast<int>(fh);
  const float u0 = rng.uniform(), u1 = rng.uniform();
  out.left = static_cast<int>(static_cast<float>(canvas_w - s.width) * u0);
  out.top = static_cast<int>(static_cast<float>(canvas_h - s.height) * u1);
  out.right = canvas_w - (out.left + s.width);
  out.bottom = canvas_h - (out.top + s.height);
  return out;
}

void pad(DetectionImage& s, int left, int top, int right, int bottom, const std::vector<double>& fill) {
  if (left < 0 || top < 0 || right < 0 || bottom < 0) {
    throw bad_input("pad: padding [{}, {}, {}, {}] (left, top, right, bottom): expected no negative side", left, top,
                    right, bottom);
  }
  if (fill.size() != 1 && fill.size() != static_cast<size_t>(s.channels)) {
    throw bad_input("pad: fill = {}: expected one value or one per channel ({})", list(fill), s.channels);
  }
  // One value: torch_pad(value=float(fill)) casts the double to uint8; several: torch.tensor(fill)
  // is float32 first, then .to(uint8). Both truncate toward zero.
  std::vector<uint8_t> px(static_cast<size_t>(s.channels));
  for (int c = 0; c < s.channels; ++c) {
    const double v = fill.size() == 1 ? fill[0] : static_cast<double>(static_cast<float>(fill[c]));
    if (!(v >= 0 && v < 256)) throw bad_input("pad: fill value {} is outside [0, 256)", v);
    px[c] = static_cast<uint8_t>(v);
  }
  const int W = s.width + left + right, H = s.height + top + bottom;
  std::vector<uint8_t> out(static_cast<size_t>(W) * H * s.channels);
  for (size_t i = 0; i < out.size(); i += s.channels) std::memcpy(&out[i], px.data(), s.channels);
  const size_t row = static_cast<size_t>(s.width) * s.channels;
  for (int y = 0; y < s.height; ++y) {
    std::memcpy(&out[(static_cast<size_t>(top + y) * W + left) * s.channels], &s.pixels[row * y], row);
  }
  s.pixels = std::move(out);
  s.width = W, s.height = H;
  // pad_bounding_boxes: boxes + [left, top, left, top] in float32, clamped to the new canvas.
  const auto l = static_cast<float>(left), t = static_cast<float>(top);
  for (size_t i = 0; i < s.boxes.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    b[0] += l, b[1] += t, b[2] += l, b[3] += t;
  }
  clamp_boxes(s);
}

}  // namespace detection

DetectionParams iou_crop_settings(const detection::IoUCropOptions& o) {
  return {{"min_scale", {o.min_scale}},
          {"max_scale", {o.max_scale}},
          {"min_aspect_ratio", {o.min_aspect_ratio}},
          {"max_aspect_ratio", {o.max_aspect_ratio}},
          {"sampler_options", o.sampler_options},
          {"trials", {static_cast<double>(o.trials)}}};
}

DetectionParams zoom_out_settings(const detection::ZoomOutOptions& o) {
  return {{"fill", o.fill}, {"side_range", {o.side_min, o.side_max}}, {"p", {o.p}}};
}

namespace {

// settings[key][0] when given, else `fallback`.
double setting(const DetectionParams& s, const char* key, double fallback) {
  const auto it = s.find(key);
  return it == s.end() || it->second.empty() ? fallback : it->second[0];
}

}  // namespace

detection::IoUCropOptions iou_crop_options(const DetectionParams& s) {
  detection::IoUCropOptions o;
  o.min_scale = setting(s, "min_scale", o.min_scale);
  o.max_scale = setting(s, "max_scale", o.max_scale);
  o.min_aspect_ratio = setting(s, "min_aspect_ratio", o.min_aspect_ratio);
  o.max_aspect_ratio = setting(s, "max_aspect_ratio", o.max_aspect_ratio);
  if (const auto it = s.find("sampler_options"); it != s.end()) o.sampler_options = it->second;
  const double trials = setting(s, "trials", static_cast<double>(o.trials));
  if (trials != std::floor(trials)) throw bad_input("random IoU crop: trials = {}: expected a whole number", trials);
  o.trials = static_cast<int64_t>(trials);
  detection::check(o);
  return o;
}

detection::ZoomOutOptions zoom_out_options(const DetectionParams& s) {
  detection::ZoomOutOptions o;
  if (const auto it = s.find("fill"); it != s.end()) o.fill = it->second;
  if (const auto it = s.find("side_range"); it != s.end()) {
    if (it->second.size() != 2) {
      throw bad_input("random zoom out: side_range = {}: expected two values [min, max]", list(it->second));
    }
    o.side_min = it->second[0], o.side_max = it->second[1];
  }
  o.p = setting(s, "p", o.p);
  detection::check(o);
  return o;
}

DetectionOp random_iou_crop_op() {
  auto apply = [](DetectionImage& s, const DetectionParams& p) {
    if (p.find("top") == p.end()) return;  // v2's empty params: the leave-as-is option
    const char* op = "random_iou_crop";
    const auto top = static_cast<int>(param(p, "top", 0, op)), left = static_cast<int>(param(p, "left", 0, op));
    const auto height = static_cast<int>(param(p, "height", 0, op)), width = static_cast<int>(param(p, "width", 0, op));
    std::vector<uint8_t> within;
    if (const auto it = p.find("is_within_crop_area"); it != p.end()) {
      for (double v : it->second) within.push_back(v != 0);
    } else {
      within = detection::centres_within(s.boxes, left, top, left + width, top + height);
    }
    detection::iou_crop(s, top, left, height, width, within);
  };
  auto draw = [](const DetectionImage& s, SampleRng& rng, const DetectionParams& settings) {
    const detection::IoUCrop c = detection::draw_iou_crop(s, rng, iou_crop_options(settings));
    DetectionParams p{{"option", {static_cast<double>(c.option)}}, {"rounds", {static_cast<double>(c.rounds)}}};
    if (!c.crop) return p;
    p["top"] = {static_cast<double>(c.top)}, p["left"] = {static_cast<double>(c.left)};
    p["height"] = {static_cast<double>(c.height)}, p["width"] = {static_cast<double>(c.width)};
    p["is_within_crop_area"].assign(c.within.begin(), c.within.end());
    return p;
  };
  return {apply, draw};
}

DetectionOp random_zoom_out_op() {
  auto apply = [](DetectionImage& s, const DetectionParams& p) {
    const auto it = p.find("padding");
    if (it == p.end()) return;  // the p draw said no
    const char* op = "random_zoom_out";
    if (it->second.size() != 4) {
      throw bad_input("{}: padding = {}: expected [left, top, right, bottom]", op, list(it->second));
    }
    const auto fill = p.find("fill");
    if (fill == p.end()) throw bad_input("{}: parameter \"fill\" expected, not given", op);
    const auto side = [&](size_t i) { return static_cast<int>(it->second[i]); };
    detection::pad(s, side(0), side(1), side(2), side(3), fill->second);
  };
  auto draw = [](const DetectionImage& s, SampleRng& rng, const DetectionParams& settings) {
    const detection::ZoomOutOptions o = zoom_out_options(settings);
    const detection::ZoomOut z = detection::draw_zoom_out(s, rng, o);
    if (!z.zoom) return DetectionParams{};
    return DetectionParams{{"padding", {double(z.left), double(z.top), double(z.right), double(z.bottom)}},
                           {"fill", o.fill}};
  };
  return {apply, draw};
}

RandomIoUCrop::RandomIoUCrop(detection::IoUCropOptions options) : settings_(iou_crop_settings(options)) {
  detection::check(options);
}

void RandomIoUCrop::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("random_iou_crop", "detection op").factory;  // once
  op.apply(s, op.draw(s, rng, settings_));
}

std::string RandomIoUCrop::describe() const {
  const auto o = iou_crop_options(settings_);
  return fmt::format("IoU crop (scale {}-{}, aspect {}-{}, {} trials)", o.min_scale, o.max_scale, o.min_aspect_ratio,
                     o.max_aspect_ratio, o.trials);
}

RandomZoomOut::RandomZoomOut(detection::ZoomOutOptions options) : settings_(zoom_out_settings(options)) {
  detection::check(options);
}

void RandomZoomOut::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("random_zoom_out", "detection op").factory;  // once
  op.apply(s, op.draw(s, rng, settings_));
}

std::string RandomZoomOut::describe() const {
  const auto o = zoom_out_options(settings_);
  return fmt::format("zoom out p={} (side {}-{})", o.p, o.side_min, o.side_max);
}

}  // namespace crucible::data
