// The detection transforms that change an image's size at random: transforms.v2's ScaleJitter
// (large scale jitter) and RandomShortestSize, and the FixedSizeCrop of torchvision's
// references/detection/transforms.py (the "lsj" preset crops and pads every image to one size
// with it). Each equals torchvision given the same draws, and draws as torchvision does
// (tests/python/test_detection_resize.py); each draw comes from the sample's own stream (law 1).
// Their functional forms are registered as the detection ops "scale_jitter",
// "random_shortest_size" and "fixed_size_crop" (detection_ops.cpp). Torch-free; immutable and
// thread-safe once built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/transforms/detection.h"

namespace crucible::data {
namespace detection {

// ScaleJitter.make_params' size for its torch.rand(1) draw `u`: scale = lo + u · (hi − lo),
// r = min(target[1] / height, target[0] / width) · scale, then int(width · r) and int(height · r).
// torchvision computes scale and r as float32 tensors (the Python doubles rounded to float32
// first) and truncates, so this does the same in float32: one ulp decides a pixel of the size.
// target[0] divides the width and target[1] the height, as torchvision's code has them.
void scale_jitter_size(int width, int height, const int target[2], double scale_lo, double scale_hi, float u,
                       int* out_width, int* out_height);

// RandomShortestSize.make_params' size for a chosen min_size: r = min_size / shorter side, capped
// by max_size / longer side (max_size 0: no cap), then int(width · r), int(height · r), in double
// as Python computes it (not Resize's _compute_resized_output_size, which rounds differently).
void shortest_size(int width, int height, int min_size, int max_size, int* out_width, int* out_height);

// The offsets FixedSizeCrop draws for an image larger than the crop in some dimension: ONE
// torch.rand(1) value `u` for both, top = int(max(height − crop_height, 0) · u) and likewise left,
// in float32 (so top and left move together along the diagonal, as the references' code does).
void fixed_size_crop_offsets(int width, int height, int crop_width, int crop_height, float u, int* top, int* left);

// FixedSizeCrop.forward given its offsets: where the image is larger than the crop, crop
// min(size) at (top, left), move the boxes by −(left, top), clamp them into the crop and drop those
// left without width or height; then pad at the right and bottom to crop_width × crop_height with
// `fill` (one uint8 per channel). A box is clamped only when the image was cropped.
void fixed_size_crop(DetectionImage& s, int crop_width, int crop_height, int top, int left,
                     const std::vector<uint8_t>& fill);

}  // namespace detection

// ScaleJitter(target_size, scale_range) with bilinear antialiased resize: one uniform draw.
class ScaleJitter final : public DetectionTransform {
 public:
  // target_size as torchvision's tuple: [0] against the width, [1] against the height.
  ScaleJitter(int target_width, int target_height, double scale_lo = 0.1, double scale_hi = 2.0);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  int target_width_, target_height_;
  double scale_lo_, scale_hi_;
};

// RandomShortestSize(min_size, max_size) with bilinear antialiased resize: one uniform choice of
// min_size.
class RandomShortestSize final : public DetectionTransform {
 public:
  RandomShortestSize(std::vector<int> min_sizes, int max_size);  // max_size 0: no cap
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  std::vector<int> min_sizes_;
  int max_size_;
};

// The references' FixedSizeCrop(size=(height, width), fill): one uniform draw when it crops.
// `fill` is one value or one per channel, in levels 0–255 (truncated to an integer as PIL's pad
// truncates the references' float mean).
class FixedSizeCrop final : public DetectionTransform {
 public:
  FixedSizeCrop(int height, int width, std::vector<double> fill);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  int height_, width_;
  std::vector<double> fill_;
};

// The functional forms detection_ops.cpp registers: "scale_jitter" (settings target_size
// [2], scale_range [2]; draws size [height, width] and rand, torch.rand(1)'s value),
// "random_shortest_size" (settings min_size [k], max_size (0: none); draws size and the chosen
// min_size) and "fixed_size_crop" (settings size [height, width], fill; draws top, left and rand
// where it crops, nothing where it only pads). Each applies params size (and fill, top, left).
DetectionOp scale_jitter_op();
DetectionOp random_shortest_size_op();
DetectionOp fixed_size_crop_op();

// The fill as uint8 per channel: one value for all or one per channel, each in [0, 255],
// truncated (PIL's int(x)); bad_input naming `what` otherwise.
std::vector<uint8_t> fill_levels(const std::vector<double>& fill, int channels, const char* what);

}  // namespace crucible::data
