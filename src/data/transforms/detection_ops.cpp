// The detection transforms' functional forms by name (see detection.h: detection_op_registry),
// one entry per transform, for the tests that hold each to torchvision given the same draws.
#include "crucible/data/transforms/detection.h"
#include "crucible/data/transforms/detection_crop.h"

#include "crucible/core/error.h"
#include "crucible/data/image/image_ops.h"
#include "crucible/data/transforms/detection_color.h"
#include "crucible/data/transforms/detection_resize.h"
#include "crucible/data/transforms/yolox.h"

namespace crucible::data {

double param(const DetectionParams& params, const std::string& key, size_t i, const char* op) {
  const auto it = params.find(key);
  if (it == params.end() || i >= it->second.size()) {
    throw bad_input("{}: parameter \"{}\"[{}] expected, not given", op, key, i);
  }
  return it->second[i];
}

const Registry<DetectionOp>& detection_op_registry() {
  static const Registry<DetectionOp> registry = [] {
    Registry<DetectionOp> r("detection op");
    r.add("horizontal_flip", "RandomHorizontalFlip: params flip (0/1); settings p",
          {[](DetectionImage& s, const DetectionParams& p) {
             if (param(p, "flip") != 0) detection::horizontal_flip(s);
           },
           [](const DetectionImage&, SampleRng& rng, const DetectionParams& o) {
             return DetectionParams{{"flip", {rng.bernoulli(static_cast<float>(param(o, "p"))) ? 1.0 : 0.0}}};
           }});
    r.add("resize", "Resize: params size [height, width]",
          {[](DetectionImage& s, const DetectionParams& p) {
             detection::resize(s, static_cast<int>(param(p, "size", 1)), static_cast<int>(param(p, "size", 0)));
           },
           nullptr});
    r.add("clamp_bounding_boxes", "ClampBoundingBoxes", {[](DetectionImage& s, const DetectionParams&) { detection::clamp_boxes(s); }, nullptr});
    r.add("sanitize_bounding_boxes", "SanitizeBoundingBoxes: params min_size, min_area",
          {[](DetectionImage& s, const DetectionParams& p) {
             detection::sanitize_boxes(s, param(p, "min_size"), param(p, "min_area"));
           },
           nullptr});
    r.add("adjust_hue", "F.adjust_hue: params hue_factor",
          {[](DetectionImage& s, const DetectionParams& p) {
             ops::adjust_hue(s.ref(), param(p, "hue_factor", 0, "adjust_hue"));
           },
           nullptr});
    r.add("random_photometric_distort",
          "RandomPhotometricDistort: params brightness_factor, contrast_factor, saturation_factor, hue_factor "
          "([] when not applied), contrast_before (0/1), channel_permutation ([] when none); settings brightness, "
          "contrast, saturation, hue ([min, max]), p",
          {detection::photometric_distort, [](const DetectionImage& s, SampleRng& rng, const DetectionParams& o) {
             return detection::draw_photometric_distort(detection::photometric_distort_options(o), s.channels, rng);
           }});
    r.add("scale_jitter", "ScaleJitter: settings target_size [2], scale_range [2]; params size [height, width]",
          scale_jitter_op());
    r.add("random_shortest_size", "RandomShortestSize: settings min_size [k], max_size (0: none); params size",
          random_shortest_size_op());
    r.add("fixed_size_crop", "references' FixedSizeCrop: settings size [height, width], fill; params top, left",
          fixed_size_crop_op());
    r.add("random_iou_crop",
          "RandomIoUCrop: settings min_scale, max_scale, min/max_aspect_ratio, sampler_options, trials; params top, "
          "left, height, width, is_within_crop_area ({}: as is)",
          random_iou_crop_op());
    r.add("random_zoom_out", "RandomZoomOut: settings fill, side_range, p; params padding, fill ({}: as is)",
          random_zoom_out_op());
    add_yolox_ops(r);  // yolox_* (yolox.h)
    return r;
  }();
  return registry;
}

}  // namespace crucible::data
