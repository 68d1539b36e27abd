// ScaleJitter, RandomShortestSize and the references' FixedSizeCrop (see detection_resize.h):
// torchvision's arithmetic, in torchvision's precision, on an image and its XYXY float32 boxes.
#include "crucible/data/transforms/detection_resize.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "crucible/core/error.h"
#include "crucible/data/transforms/augment.h"

namespace crucible::data {
namespace detection {

void scale_jitter_size(int width, int height, const int target[2], double scale_lo, double scale_hi, float u,
                       int* out_width, int* out_height) {
  // scale = lo + torch.rand(1) * (hi - lo): (hi - lo) is a Python double, rounded to float32 when
  // it multiplies the float32 tensor; the sum is float32 too.
  const float scale = static_cast<float>(scale_lo) + u * static_cast<float>(scale_hi - scale_lo);
  // min(...) is Python's double; "* scale" rounds it to float32 and multiplies in float32.
  const double m = std::min(static_cast<double>(target[1]) / height, static_cast<double>(target[0]) / width);
  const float r = static_cast<float>(m) * scale;
  // int(orig_width * r): an int times a float32 tensor is a float32 product, truncated.
  *out_width = static_cast<int>(static_cast<float>(width) * r);
  *out_height = static_cast<int>(static_cast<float>(height) * r);
}

void shortest_size(int width, int height, int min_size, int max_size, int* out_width, int* out_height) {
  double r = static_cast<double>(min_size) / std::min(width, height);
  if (max_size > 0) r = std::min(r, static_cast<double>(max_size) / std::max(width, height));
  *out_width = static_cast<int>(width * r);
  *out_height = static_cast<int>(height * r);
}

void fixed_size_crop_offsets(int width, int height, int crop_width, int crop_height, float u, int* top, int* left) {
  // int(offset_height * r) with r = torch.rand(1): float32 products, truncated.
  *top = static_cast<int>(static_cast<float>(std::max(height - crop_height, 0)) * u);
  *left = static_cast<int>(static_cast<float>(std::max(width - crop_width, 0)) * u);
}

namespace {

// FixedSizeCrop._crop: the image's window, then the boxes moved into it, clamped and filtered.
void crop_window(DetectionImage& s, int top, int left, int width, int height) {
  const size_t row = static_cast<size_t>(width) * s.channels;
  std::vector<uint8_t> out(row * height);
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = s.pixels.data() + (static_cast<size_t>(top + y) * s.width + left) * s.channels;
    std::memcpy(out.data() + row * y, src, row);
  }
  s.pixels = std::move(out);
  s.width = width;
  s.height = height;
  const auto L = static_cast<float>(left), T = static_cast<float>(top);
  const auto W = static_cast<float>(width), H = static_cast<float>(height);
  std::vector<uint8_t> keep(s.boxes.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    b[0] = std::clamp(b[0] - L, 0.0f, W), b[2] = std::clamp(b[2] - L, 0.0f, W);
    b[1] = std::clamp(b[1] - T, 0.0f, H), b[3] = std::clamp(b[3] - T, 0.0f, H);
    keep[i] = b[0] < b[2] && b[1] < b[3];
  }
  s.boxes.keep(keep);
}

// FixedSizeCrop._pad with padding [0, 0, right, bottom]: the boxes do not move.
void pad_right_bottom(DetectionImage& s, int width, int height, const std::vector<uint8_t>& fill) {
  const int c = s.channels;
  const size_t out_row = static_cast<size_t>(width) * c, row = static_cast<size_t>(s.width) * c;
  std::vector<uint8_t> pattern(out_row);  // a row of the fill, copied where the image is not
  for (size_t i = 0; i < out_row; i += c) std::memcpy(pattern.data() + i, fill.data(), c);
  std::vector<uint8_t> out(out_row * height);
  for (int y = 0; y < height; ++y) {
    uint8_t* o = out.data() + out_row * y;
    const size_t image = y < s.height ? row : 0;
    if (image > 0) std::memcpy(o, s.pixels.data() + row * y, image);
    std::memcpy(o + image, pattern.data() + image, out_row - image);
  }
  s.pixels = std::move(out);
  s.width = width;
  s.height = height;
}

}  // namespace

void fixed_size_crop(DetectionImage& s, int crop_width, int crop_height, int top, int left,
                     const std::vector<uint8_t>& fill) {
  if (crop_width < 1 || crop_height < 1) {
    throw bad_input("fixed size crop: size {}x{} (width x height) must be at least 1x1", crop_width, crop_height);
  }
  if (fill.size() != static_cast<size_t>(s.channels)) {
    throw bad_input("fixed size crop: {} fill values for {} channels", fill.size(), s.channels);
  }
  const int new_height = std::min(s.height, crop_height), new_width = std::min(s.width, crop_width);
  if (new_height != s.height || new_width != s.width) {
    if (top < 0 || top > s.height - new_height || left < 0 || left > s.width - new_width) {
      throw bad_input("fixed size crop: top = {}, left = {} outside 0..{}, 0..{} for a {}x{} image cropped to {}x{}",
                      top, left, s.height - new_height, s.width - new_width, s.width, s.height, crop_width,
                      crop_height);
    }
    crop_window(s, top, left, new_width, new_height);
  }
  if (new_height < crop_height || new_width < crop_width) pad_right_bottom(s, crop_width, crop_height, fill);
}

}  // namespace detection

std::vector<uint8_t> fill_levels(const std::vector<double>& fill, int channels, const char* what) {
  if (fill.size() != 1 && fill.size() != static_cast<size_t>(channels)) {
    throw bad_input("{}: one fill value or one per channel ({}) expected, found {}", what, channels, fill.size());
  }
  std::vector<uint8_t> out(static_cast<size_t>(channels));
  for (size_t c = 0; c < out.size(); ++c) {
    const double v = fill[fill.size() == 1 ? 0 : c];
    if (!(v >= 0 && v < 256)) throw bad_input("{}: fill value {} outside the levels 0-255", what, v);
    out[c] = static_cast<uint8_t>(v);  // PIL's pad: int(x), truncated
  }
  return out;
}

namespace {

// A setting that is a list of whole numbers, each at least `min`: bad_input naming it otherwise.
std::vector<int> whole_numbers(const DetectionParams& p, const std::string& key, size_t n, int min, const char* op) {
  const auto it = p.find(key);
  if (it == p.end() || (n > 0 && it->second.size() != n) || it->second.empty()) {
    throw bad_input("{}: setting \"{}\" expects {} whole numbers", op, key, n > 0 ? std::to_string(n) : "some");
  }
  std::vector<int> out;
  for (double v : it->second) {
    if (!(v >= min && v <= 1 << 20) || v != static_cast<int>(v)) {
      throw bad_input("{}: {} = {}: expected a whole number from {} to {}", op, key, v, min, 1 << 20);
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

void resize_to_params(DetectionImage& s, const DetectionParams& p, const char* op) {
  detection::resize(s, static_cast<int>(param(p, "size", 1, op)), static_cast<int>(param(p, "size", 0, op)));
}

}  // namespace

DetectionOp scale_jitter_op() {
  return {[](DetectionImage& s, const DetectionParams& p) { resize_to_params(s, p, "scale_jitter"); },
          [](const DetectionImage& s, SampleRng& rng, const DetectionParams& o) {
            const std::vector<int> target = whole_numbers(o, "target_size", 2, 1, "scale_jitter");
            const double lo = param(o, "scale_range", 0, "scale_jitter"), hi = param(o, "scale_range", 1, "scale_jitter");
            const float u = rng.uniform();
            int w = 0, h = 0;
            detection::scale_jitter_size(s.width, s.height, target.data(), lo, hi, u, &w, &h);
            return DetectionParams{{"size", {double(h), double(w)}}, {"rand", {u}}};
          }};
}

DetectionOp random_shortest_size_op() {
  return {[](DetectionImage& s, const DetectionParams& p) { resize_to_params(s, p, "random_shortest_size"); },
          [](const DetectionImage& s, SampleRng& rng, const DetectionParams& o) {
            const std::vector<int> sizes = whole_numbers(o, "min_size", 0, 1, "random_shortest_size");
            const int max_size = whole_numbers(o, "max_size", 1, 0, "random_shortest_size")[0];
            // min_size[int(torch.randint(len(min_size), ()))]
            const int chosen = sizes[static_cast<size_t>(random_index(rng, static_cast<int>(sizes.size())))];
            int w = 0, h = 0;
            detection::shortest_size(s.width, s.height, chosen, max_size, &w, &h);
            return DetectionParams{{"size", {double(h), double(w)}}, {"min_size", {double(chosen)}}};
          }};
}

DetectionOp fixed_size_crop_op() {
  return {[](DetectionImage& s, const DetectionParams& p) {
            const std::vector<int> size = whole_numbers(p, "size", 2, 1, "fixed_size_crop");
            const auto it = p.find("fill");
            const std::vector<uint8_t> fill =
                fill_levels(it == p.end() ? std::vector<double>{0.0} : it->second, s.channels, "fixed_size_crop");
            const auto top = p.count("top") ? static_cast<int>(param(p, "top")) : 0;
            const auto left = p.count("left") ? static_cast<int>(param(p, "left")) : 0;
            detection::fixed_size_crop(s, size[1], size[0], top, left, fill);
          },
          [](const DetectionImage& s, SampleRng& rng, const DetectionParams& o) {
            const std::vector<int> size = whole_numbers(o, "size", 2, 1, "fixed_size_crop");
            // The references draw torch.rand(1) only when the image is larger than the crop.
            if (s.height <= size[0] && s.width <= size[1]) return DetectionParams{{"top", {0.0}}, {"left", {0.0}}};
            const float u = rng.uniform();
            int top = 0, left = 0;
            detection::fixed_size_crop_offsets(s.width, s.height, size[1], size[0], u, &top, &left);
            return DetectionParams{{"top", {double(top)}}, {"left", {double(left)}}, {"rand", {u}}};
          }};
}

namespace {

// A transform's apply: its registered op's draw, then its apply with the draws and the settings.
void draw_then_apply(const DetectionOp& op, DetectionImage& s, SampleRng& rng, const DetectionParams& settings) {
  DetectionParams params = op.draw(s, rng, settings);
  params.insert(settings.begin(), settings.end());  // draws first: a drawn key wins
  op.apply(s, params);
}

}  // namespace

ScaleJitter::ScaleJitter(int target_width, int target_height, double scale_lo, double scale_hi)
    : target_width_(target_width), target_height_(target_height), scale_lo_(scale_lo), scale_hi_(scale_hi) {
  if (target_width < 1 || target_height < 1) {
    throw bad_input("scale jitter: target size {}x{} must be at least 1x1", target_width, target_height);
  }
  if (!(scale_lo > 0 && scale_lo <= scale_hi)) {
    throw bad_input("scale jitter: scale range ({}, {}) must have 0 < min <= max", scale_lo, scale_hi);
  }
}

void ScaleJitter::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("scale_jitter", "detection op").factory;  // once
  draw_then_apply(op, s, rng,
                  {{"target_size", {double(target_width_), double(target_height_)}}, {"scale_range", {scale_lo_, scale_hi_}}});
}

std::string ScaleJitter::describe() const {
  return fmt::format("scale jitter to {}x{} x [{}, {}]", target_width_, target_height_, scale_lo_, scale_hi_);
}

RandomShortestSize::RandomShortestSize(std::vector<int> min_sizes, int max_size)
    : min_sizes_(std::move(min_sizes)), max_size_(max_size) {
  if (min_sizes_.empty()) throw bad_input("random shortest size: min_size needs at least one size");
  for (int m : min_sizes_) {
    if (m < 1) throw bad_input("random shortest size: min_size {} must be at least 1", m);
  }
  if (max_size_ < 0) throw bad_input("random shortest size: max_size = {} must be at least 0 (0: none)", max_size_);
}

void RandomShortestSize::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("random_shortest_size", "detection op").factory;  // once
  draw_then_apply(op, s, rng,
                  {{"min_size", std::vector<double>(min_sizes_.begin(), min_sizes_.end())}, {"max_size", {double(max_size_)}}});
}

std::string RandomShortestSize::describe() const {
  return fmt::format("random shortest side {}..{} ({} sizes){}", min_sizes_.front(), min_sizes_.back(), min_sizes_.size(),
                     max_size_ > 0 ? fmt::format(" (longer at most {})", max_size_) : "");
}

FixedSizeCrop::FixedSizeCrop(int height, int width, std::vector<double> fill)
    : height_(height), width_(width), fill_(std::move(fill)) {
  if (height_ < 1 || width_ < 1) throw bad_input("fixed size crop: size {}x{} must be at least 1x1", width_, height_);
  fill_levels(fill_, static_cast<int>(std::max<size_t>(fill_.size(), 1)), "fixed size crop");  // checks the levels
}

void FixedSizeCrop::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("fixed_size_crop", "detection op").factory;  // once
  draw_then_apply(op, s, rng, {{"size", {double(height_), double(width_)}}, {"fill", fill_}});
}

std::string FixedSizeCrop::describe() const { return fmt::format("fixed size crop {}x{}", width_, height_); }

}  // namespace crucible::data
