// Detection transforms (see detection.h): torchvision.transforms.v2's arithmetic on an image
// and its XYXY float32 boxes.
#include "crucible/data/transforms/detection.h"

#include <fmt/format.h>

#include <algorithm>

#include "crucible/core/error.h"
#include "crucible/data/transforms/transform.h"

namespace crucible::data {
namespace detection {

void horizontal_flip(DetectionImage& s) {
  hflip_image(s.pixels.data(), s.width, s.height, s.channels);
  const auto W = static_cast<float>(s.width);
  for (size_t i = 0; i < s.boxes.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    // bounding_boxes[:, [2, 0]] = bounding_boxes[:, [0, 2]].sub_(W).neg_()
    const float x1 = -(b[0] - W), x2 = -(b[2] - W);
    b[2] = x1;
    b[0] = x2;
  }
}

void resize(DetectionImage& s, int width, int height) {
  if (width < 1 || height < 1) throw bad_input("resize to {}x{}: expected a size of at least 1x1", width, height);
  if (width == s.width && height == s.height) return;
  std::vector<uint8_t> out(static_cast<size_t>(width) * height * s.channels);
  resize_image(s.pixels.data(), s.width, s.height, s.width * s.channels, s.channels, out.data(), width, height);
  // ratios = torch.tensor([w_ratio, h_ratio, …]): Python's double quotient, held as float32.
  const auto rw = static_cast<float>(static_cast<double>(width) / s.width);
  const auto rh = static_cast<float>(static_cast<double>(height) / s.height);
  for (size_t i = 0; i < s.boxes.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    b[0] *= rw, b[1] *= rh, b[2] *= rw, b[3] *= rh;
  }
  s.pixels = std::move(out);
  s.width = width;
  s.height = height;
}

void resized_size(int width, int height, int size, int max_size, int* out_width, int* out_height) {
  const int64_t shorter = std::min(width, height), longer = std::max(width, height);
  int64_t new_short = size;
  auto new_long = static_cast<int64_t>(static_cast<double>(int64_t{size} * longer) / static_cast<double>(shorter));
  if (max_size > 0) {
    if (max_size <= size) {
      throw bad_input("max_size = {} must be greater than the shorter side's size {}", max_size, size);
    }
    if (new_long > max_size) {
      new_short = static_cast<int64_t>(static_cast<double>(int64_t{max_size} * new_short) / static_cast<double>(new_long));
      new_long = max_size;
    }
  }
  const bool portrait = width <= height;
  *out_width = static_cast<int>(portrait ? new_short : new_long);
  *out_height = static_cast<int>(portrait ? new_long : new_short);
}

void clamp_boxes(DetectionImage& s) {
  const auto W = static_cast<float>(s.width), H = static_cast<float>(s.height);
  for (size_t i = 0; i < s.boxes.size(); ++i) {
    float* b = &s.boxes.xyxy[4 * i];
    b[0] = std::clamp(b[0], 0.0f, W), b[2] = std::clamp(b[2], 0.0f, W);
    b[1] = std::clamp(b[1], 0.0f, H), b[3] = std::clamp(b[3], 0.0f, H);
  }
}

void sanitize_boxes(DetectionImage& s, double min_size, double min_area) {
  const auto W = static_cast<float>(s.width), H = static_cast<float>(s.height);
  const auto ms = static_cast<float>(min_size), ma = static_cast<float>(min_area);
  std::vector<uint8_t> keep(s.boxes.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    const float* b = &s.boxes.xyxy[4 * i];
    const float w = b[2] - b[0], h = b[3] - b[1];
    keep[i] = w >= ms && h >= ms && b[0] >= 0 && b[1] >= 0 && b[2] >= 0 && b[3] >= 0 && w * h >= ma && b[0] <= W &&
              b[2] <= W && b[1] <= H && b[3] <= H;
  }
  s.boxes.keep(keep);
}

}  // namespace detection

DetectionHorizontalFlip::DetectionHorizontalFlip(double p) : p_(p) {
  if (!(p >= 0 && p <= 1)) throw bad_input("horizontal flip p = {}: expected 0 <= p <= 1", p);
}

void DetectionHorizontalFlip::apply(DetectionImage& s, SampleRng& rng) const {
  static const DetectionOp& op = detection_op_registry().get("horizontal_flip", "detection op").factory;  // once
  op.apply(s, op.draw(s, rng, {{"p", {p_}}}));
}

std::string DetectionHorizontalFlip::describe() const { return fmt::format("flip p={}", p_); }

DetectionResize::DetectionResize(int height, int width, int max_size)
    : height_(height), width_(width), max_size_(max_size) {
  if (height_ < 1 || width_ < 0) throw bad_input("resize to {}x{}: expected sizes of at least 1", height_, width_);
}

void DetectionResize::apply(DetectionImage& s, SampleRng&) const {
  int w = width_, h = height_;
  if (width_ == 0) detection::resized_size(s.width, s.height, height_, max_size_, &w, &h);
  detection::resize(s, w, h);
}

std::string DetectionResize::describe() const {
  return width_ == 0 ? fmt::format("resize shorter side {}{}", height_,
                                   max_size_ > 0 ? fmt::format(" (longer at most {})", max_size_) : "")
                     : fmt::format("resize {}x{}", width_, height_);
}

SanitizeBoundingBoxes::SanitizeBoundingBoxes(double min_size, double min_area) : min_size_(min_size), min_area_(min_area) {
  if (min_size < 1 || min_area < 1) {
    throw bad_input("sanitize boxes: min_size = {} and min_area = {} must be at least 1", min_size, min_area);
  }
}

std::string SanitizeBoundingBoxes::describe() const {
  return fmt::format("sanitize boxes (min size {}, min area {})", min_size_, min_area_);
}

}  // namespace crucible::data
