// Detectors: a Model whose forward takes images of any size with their boxes, torchvision's
// detection models in C++ (fcos.h). In training a detector gives its loss dict; in evaluation
// its detections, in each image's own pixel coordinates. Light header (forward declarations):
// the modules live in src/nn/detection/.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "crucible/nn/model.h"

namespace crucible::nn {

// One image's ground truth: boxes [n, 4] float XYXY in the image's pixels, labels [n] int64
// (n may be 0: an image of background only).
struct BoxTargets {
  at::Tensor boxes;
  at::Tensor labels;
};

// One image's detections, best first: boxes [k, 4] float XYXY in the image's own pixels (before
// the detector's resize), scores [k], labels [k] int64.
struct Detections {
  at::Tensor boxes;
  at::Tensor scores;
  at::Tensor labels;
};

// A named loss term ("classification", "bbox_regression", …) in the detector's order; their sum
// is what backward runs on.
using LossDict = std::vector<std::pair<std::string, at::Tensor>>;

class Detector : public ModuleModel {
 public:
  using ModuleModel::ModuleModel;
  // A detector takes a list of images of different sizes; forward on one tensor is refused.
  at::Tensor forward(const at::Tensor& x) override;
  // The loss terms for `images` (each [3, h, w] float in 0–1) and their targets, each image
  // resized so its shorter side is `min_size` (0: the options' min_size; M4's multi-scale step
  // passes its own), the longer side capped at max_size.
  virtual LossDict losses(const std::vector<at::Tensor>& images, const std::vector<BoxTargets>& targets,
                          int64_t min_size) = 0;
  LossDict losses(const std::vector<at::Tensor>& images, const std::vector<BoxTargets>& targets) {
    return losses(images, targets, 0);
  }
  // Post-processed detections for each image (call in eval mode, without gradients).
  virtual std::vector<Detections> detect(const std::vector<at::Tensor>& images) = 0;
  // The ResNet trunk is backbone.body (model.init from torchvision's ImageNet weights).
  std::string trunk_prefix() const override { return "backbone.body."; }
};

// The settings of a detector's recipe: torchvision's keyword arguments of the same names.
struct DetectorOptions {
  int64_t num_classes = 91;            // torchvision's default: COCO's 91 category ids (0 unused)
  int64_t min_size = 800;              // GeneralizedRCNNTransform: shorter side …
  int64_t max_size = 1333;             // … unless the longer side would pass this
  std::vector<double> image_mean = {0.485, 0.456, 0.406};
  std::vector<double> image_std = {0.229, 0.224, 0.225};
  int64_t trainable_backbone_layers = 3;  // 0–5: trunk stages trained from the last (5: all)
  bool frozen_norm = true;                // the trunk's norm: FrozenBatchNorm2d, or BatchNorm2d
  double score_thresh = 0.2;              // FCOS: 0.2, RetinaNet: 0.05
  double nms_thresh = 0.6;                // FCOS: 0.6, RetinaNet: 0.5
  int64_t detections_per_img = 100;
  int64_t topk_candidates = 1000;
  double center_sampling_radius = 1.5;    // FCOS
};

// torchvision.models.detection.fcos_resnet50_fpn's model (FCOS over resnet{18,34,50} with an
// FPN on layer2–layer4 and P6/P7 from P5), the same state_dict names and shapes, FrozenBatchNorm2d
// in the trunk and the trunk's first 5 - trainable_backbone_layers stages frozen. Weights come
// from torch's default generator (seed it first). bad_input for a depth other than 18, 34, 50
// or options out of range.
std::unique_ptr<Detector> make_fcos(int depth, const DetectorOptions& options);

// torchvision.models.detection.retinanet_resnet50_fpn's model (v1: RetinaNet over the same
// backbone, heads without norms, 9 anchors per place), likewise. RetinaNet's own defaults are
// score_thresh 0.05 and nms_thresh 0.5 (set them in `options`).
std::unique_ptr<Detector> make_retinanet(int depth, const DetectorOptions& options);

}  // namespace crucible::nn
