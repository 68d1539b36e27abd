// SSD's two geometric augmentations for detection, as torchvision.transforms.v2 has them:
// RandomIoUCrop (a crop whose IoU with some box reaches a drawn minimum; the boxes whose centre
// falls outside it are dropped with their labels) and RandomZoomOut (the image placed on a larger
// canvas of the fill colour). Each is a functional operation given its draws (pixels and boxes
// equal to v2's transform(inpt, params)), a draw that follows v2's make_params' law decision by
// decision from the sample's own stream (law 1), and a DetectionTransform that is draw then apply
// through its entry in detection_op_registry ("random_iou_crop", "random_zoom_out"), so what
// tests/python/test_detection_crop.py holds to torchvision is what training runs. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/rng.h"
#include "crucible/data/transforms/detection.h"

namespace crucible::data {
namespace detection {

// RandomIoUCrop's settings, torchvision's defaults.
struct IoUCropOptions {
  double min_scale = 0.3, max_scale = 1.0;
  double min_aspect_ratio = 0.5, max_aspect_ratio = 2.0;
  // The minimum IoU each round draws from; a value >= 1 leaves the sample as it is.
  std::vector<double> sampler_options = {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0};
  int64_t trials = 40;  // crops tried for one drawn minimum before drawing another
};
// bad_input naming the setting and its value when `o` cannot be searched with.
void check(const IoUCropOptions& o);

// What RandomIoUCrop's make_params returns: no crop (the leave-as-is option), or the crop and
// which boxes have their centre strictly inside it; `option` and `rounds` say which sampler option
// gave it after how many option draws (for the tests of the search's law).
struct IoUCrop {
  bool crop = false;
  int top = 0, left = 0, height = 0, width = 0;
  std::vector<uint8_t> within;  // per box of the sample: its centre inside the crop
  int64_t option = 0, rounds = 0;
};
IoUCrop draw_iou_crop(const DetectionImage& s, SampleRng& rng, const IoUCropOptions& o);

// Per box: 0.5·(x1 + x2) and 0.5·(y1 + y2) (float32) strictly inside (left, right) × (top, bottom).
std::vector<uint8_t> centres_within(const Boxes& boxes, int left, int top, int right, int bottom);

// RandomIoUCrop's transform given its crop: F.crop of the image and the boxes (shifted by
// (left, top) and clamped to the crop), then the boxes with within[i] == 0 dropped with their
// labels (v2 zeroes them for SanitizeBoundingBoxes to drop).
void iou_crop(DetectionImage& s, int top, int left, int height, int width, const std::vector<uint8_t>& within);

// RandomZoomOut's settings: fill as v2 takes it (one value, or one per channel), side_range, p.
struct ZoomOutOptions {
  std::vector<double> fill = {0.0};
  double side_min = 1.0, side_max = 4.0;
  double p = 0.5;
};
void check(const ZoomOutOptions& o);

// What RandomZoomOut draws: whether it zooms (its _RandomApplyTransform draw) and the padding
// [left, top, right, bottom] of the canvas.
struct ZoomOut {
  bool zoom = false;
  int left = 0, top = 0, right = 0, bottom = 0;
};
ZoomOut draw_zoom_out(const DetectionImage& s, SampleRng& rng, const ZoomOutOptions& o);

// F.pad(padding=[left, top, right, bottom], fill) on the image and its boxes: the canvas filled
// with `fill` as torchvision casts it to uint8, the image at (left, top), the boxes shifted by
// (left, top) in float32 and clamped to the canvas.
void pad(DetectionImage& s, int left, int top, int right, int bottom, const std::vector<double>& fill);

}  // namespace detection

// RandomIoUCrop() (SSD's crop): draws a crop by v2's search, crops, drops the boxes whose centre
// is outside (follow it by SanitizeBoundingBoxes, as v2 requires, for boxes left without area).
class RandomIoUCrop final : public DetectionTransform {
 public:
  explicit RandomIoUCrop(detection::IoUCropOptions options = {});
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  DetectionParams settings_;
};

// RandomZoomOut(fill, side_range, p) (SSD's zoom out).
class RandomZoomOut final : public DetectionTransform {
 public:
  explicit RandomZoomOut(detection::ZoomOutOptions options);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  DetectionParams settings_;
};

// The registry entries (detection_ops.cpp). random_iou_crop: settings min_scale, max_scale,
// min_aspect_ratio, max_aspect_ratio, sampler_options, trials (absent: torchvision's defaults);
// params {} (leave as is) or top, left, height, width, is_within_crop_area (per box 0/1; absent:
// computed from the boxes), with option and rounds (which sampler option after how many draws of
// one, for the tests). random_zoom_out: settings fill, side_range, p; params {} (no zoom) or
// padding [left, top, right, bottom] and fill.
DetectionOp random_iou_crop_op();
DetectionOp random_zoom_out_op();

// The operations' settings as their registry entries take them (every key, by name).
DetectionParams iou_crop_settings(const detection::IoUCropOptions& o);
DetectionParams zoom_out_settings(const detection::ZoomOutOptions& o);
// The settings back from a registry entry's settings: a key not given keeps torchvision's default.
detection::IoUCropOptions iou_crop_options(const DetectionParams& settings);
detection::ZoomOutOptions zoom_out_options(const DetectionParams& settings);

}  // namespace crucible::data
