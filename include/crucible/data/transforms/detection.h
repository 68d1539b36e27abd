// Detection transforms: each moves an image and its boxes together, as torchvision's
// transforms.v2 moves a tv_tensors.Image with its tv_tensors.BoundingBoxes (XYXY, float32), with
// torchvision's arithmetic so that pixels and boxes equal the oracle's given the same draws
// (tests/python/test_detection_transforms.py). A transform draws what it needs from the sample's
// own stream (law 1). The functional operations below are what the transforms are made of; the
// Python module binds them for the tests. Torch-free; transforms are immutable and thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crucible/core/registry.h"
#include "crucible/core/rng.h"
#include "crucible/data/image/boxes.h"
#include "crucible/data/transforms/sample_transform.h"

namespace crucible::data {

// A detection sample in flight: [height, width, channels] uint8 pixels and its boxes, in pixels
// of this image.
struct DetectionImage {
  std::vector<uint8_t> pixels;
  int width = 0, height = 0, channels = 3;
  Boxes boxes;
  ImageRef ref() { return ImageRef{pixels.data(), width, height, channels, false}; }
};

// What a transform that mixes samples (Mosaic, MixUp) reads through, and the epoch (a schedule
// that turns mosaic off for the last epochs): the data set's size and sample `index` decoded
// with its boxes, before any transform (DetectionPipeline gives it).
struct DetectionContext {
  int64_t epoch = 0;
  int64_t size = 0;
  std::function<DetectionImage(int64_t index)> load;
};

class DetectionTransform {
 public:
  virtual ~DetectionTransform() = default;
  virtual void apply(DetectionImage& sample, SampleRng& rng) const = 0;
  // The pipeline calls this one; a transform that reads other samples or the epoch overrides it.
  virtual void apply(DetectionImage& sample, SampleRng& rng, const DetectionContext& context) const {
    apply(sample, rng);
  }
  virtual std::string describe() const = 0;  // one short phrase for the pipeline's log line
};
using DetectionTransforms = std::vector<std::shared_ptr<const DetectionTransform>>;

// A transform's functional form, for the tests that hold it to torchvision (the Python module's
// detection_op and detection_draw): `apply` runs the operation with given parameters (its draws
// and its settings, by name); `draw` makes the draws the transform makes for sample `s` from
// `rng`, given its settings (null for an operation without draws). A transform's apply() is
// draw then apply, so what the tests compare is what training runs.
using DetectionParams = std::map<std::string, std::vector<double>>;
struct DetectionOp {
  std::function<void(DetectionImage& s, const DetectionParams& params)> apply;
  std::function<DetectionParams(const DetectionImage& s, SampleRng& rng, const DetectionParams& settings)> draw;
};
// Every detection transform's functional form by name (src/data/transforms/detection_ops.cpp).
const Registry<DetectionOp>& detection_op_registry();
// params[key][i], or bad_input naming the operation and the key.
double param(const DetectionParams& params, const std::string& key, size_t i = 0, const char* op = "detection op");

namespace detection {

// F.horizontal_flip on the image and its boxes: x1' = W - x2, x2' = W - x1.
void horizontal_flip(DetectionImage& s);

// F.resize(size=[height, width], antialias=True, bilinear) on the image and its boxes: pixels as
// torch resizes uint8 (resize_image), boxes × (new / old) with the ratio in float32, as
// resize_bounding_boxes multiplies by a float32 tensor. No change when the size is the same.
void resize(DetectionImage& s, int width, int height);

// torchvision's _compute_resized_output_size for a single `size` (the shorter side) and an
// optional `max_size` (0: none) — what Resize(size, max_size) and RandomShortestSize give.
void resized_size(int width, int height, int size, int max_size, int* out_width, int* out_height);

// F.clamp_bounding_boxes: x into [0, W], y into [0, H].
void clamp_boxes(DetectionImage& s);

// SanitizeBoundingBoxes(min_size, min_area): drops boxes narrower or lower than min_size, with an
// area below min_area, with a negative coordinate or past the image, and their labels.
void sanitize_boxes(DetectionImage& s, double min_size = 1.0, double min_area = 1.0);

}  // namespace detection

// RandomHorizontalFlip(p) for detection: one uniform draw, u < p mirrors image and boxes.
class DetectionHorizontalFlip final : public DetectionTransform {
 public:
  explicit DetectionHorizontalFlip(double p);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  double p_;
};

// Resize(size) with size = [height, width] (both > 0), or the shorter side to `size` with
// width 0, capped by max_size; no draws.
class DetectionResize final : public DetectionTransform {
 public:
  DetectionResize(int height, int width, int max_size = 0);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  int height_, width_, max_size_;
};

class SanitizeBoundingBoxes final : public DetectionTransform {
 public:
  explicit SanitizeBoundingBoxes(double min_size = 1.0, double min_area = 1.0);
  void apply(DetectionImage& s, SampleRng&) const override { detection::sanitize_boxes(s, min_size_, min_area_); }
  std::string describe() const override;

 private:
  double min_size_, min_area_;
};

class ClampBoundingBoxes final : public DetectionTransform {
 public:
  void apply(DetectionImage& s, SampleRng&) const override { detection::clamp_boxes(s); }
  std::string describe() const override { return "clamp boxes"; }
};

}  // namespace crucible::data
