// The parts torchvision's one-stage detectors share (FCOS, RetinaNet), written after
// torchvision/models/detection and torchvision/ops operation for operation: the resize and
// batching of GeneralizedRCNNTransform, the FPN with P6/P7, the anchor grid, BoxLinearCoder,
// the focal and GIoU losses. Internal to src/nn/detection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include "crucible/nn/detection/detector.h"

namespace crucible::nn::detection {

// GeneralizedRCNNTransform's output: the images normalised, resized and padded into one
// [B, 3, H, W] tensor (H and W multiples of 32), each image's size after the resize, and the
// targets' boxes resized with them. `min_size` > 0 replaces options.min_size (one training
// step's multi-scale size, as GeneralizedRCNNTransform's torch_choice(min_size) draws one).
struct ImageList {
  at::Tensor tensors;
  std::vector<std::pair<int64_t, int64_t>> sizes;  // (height, width) after the resize
};
ImageList transform_images(const std::vector<at::Tensor>& images, const DetectorOptions& options,
                           std::vector<BoxTargets>* targets, int64_t min_size = 0);
// transform.postprocess's resize_boxes: boxes from `from` (h, w) to `to`.
at::Tensor resize_boxes(const at::Tensor& boxes, std::pair<int64_t, int64_t> from, std::pair<int64_t, int64_t> to);
// box_ops.clip_boxes_to_image.
at::Tensor clip_boxes_to_image(const at::Tensor& boxes, std::pair<int64_t, int64_t> size);

// torchvision.ops.FeaturePyramidNetwork over `in_channels` with LastLevelP6P7(256, 256):
// children inner_blocks, layer_blocks (each i.0 a conv), extra_blocks (p6, p7).
struct FpnImpl : torch::nn::Module {
  FpnImpl(const std::vector<int64_t>& in_channels, int64_t out_channels);
  // The FPN outputs for each input level, then P6 and P7.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& x);
  torch::nn::ModuleList inner_blocks, layer_blocks;
  std::shared_ptr<torch::nn::Module> extra_blocks;
  torch::nn::Conv2d p6{nullptr}, p7{nullptr};
};

// BackboneWithFPN over a ResNet trunk: children body (the trunk) and fpn; layer2–layer4 feed
// the FPN. trainable_layers as torchvision's _resnet_fpn_extractor (the rest stops its gradient).
struct ResNetFpnImpl : torch::nn::Module {
  ResNetFpnImpl(int depth, int64_t trainable_layers, bool frozen_norm = true);
  std::vector<at::Tensor> forward(const at::Tensor& x);
  std::shared_ptr<torch::nn::Module> body;
  std::shared_ptr<FpnImpl> fpn;
};

// A head's 3×3 conv (padding 1) drawn from N(0, 0.01), its bias `bias` (both heads' init).
torch::nn::Conv2d head_conv(int64_t in, int64_t out, double bias);
// A head's output of one level, [N, A·K, H, W] → [N, H·W·A, K], as the heads reshape it.
at::Tensor flatten_level(const at::Tensor& t, int64_t k);
// The classification head's prior: its bias -log((1 - 0.01) / 0.01), so every score starts at 0.01.
double prior_bias();

// FCOSClassificationHead / RetinaNetClassificationHead: `tower` (children conv), then cls_logits,
// a 3×3 conv to anchors × num_classes at the prior bias; forward gives [N, all places, C].
struct ClassificationHeadImpl : torch::nn::Module {
  ClassificationHeadImpl(torch::nn::Sequential tower, int64_t channels, int64_t anchors, int64_t num_classes);
  at::Tensor forward(const std::vector<at::Tensor>& x);
  int64_t num_classes;
  torch::nn::Sequential conv{nullptr};
  torch::nn::Conv2d cls_logits{nullptr};
};

// AnchorGenerator with one size per level and aspect ratio 1 (FCOS), or `scales` × ratios
// (RetinaNet): the anchors of every level of `features` for the padded batch, concatenated
// [A, 4], and the count per level.
at::Tensor grid_anchors(const at::Tensor& batch, const std::vector<at::Tensor>& features,
                        const std::vector<std::vector<double>>& sizes, const std::vector<double>& aspect_ratios,
                        std::vector<int64_t>* per_level);

// BoxLinearCoder(normalize_by_size=True).
at::Tensor linear_encode(const at::Tensor& reference, const at::Tensor& proposals);
at::Tensor linear_decode(const at::Tensor& rel_codes, const at::Tensor& boxes);

// torchvision.ops.sigmoid_focal_loss(reduction="none") and generalized_box_iou_loss(reduction="none").
at::Tensor sigmoid_focal_loss(const at::Tensor& inputs, const at::Tensor& targets, double alpha = 0.25,
                              double gamma = 2);
at::Tensor generalized_box_iou_loss(const at::Tensor& boxes1, const at::Tensor& boxes2, double eps = 1e-7);

// BoxCoder(weights=(1, 1, 1, 1)) of RetinaNet: encode_single and decode_single (dw, dh clamped
// at log(1000 / 16)).
at::Tensor box_encode(const at::Tensor& reference, const at::Tensor& proposals);
at::Tensor box_decode(const at::Tensor& rel_codes, const at::Tensor& boxes);

// postprocess_detections for one image: `scores` gives the [n, C] scores of the level whose
// anchors start at `start` (computed per level, as torchvision does, so that vectorised kernels
// round alike), `regression` [A, 4] and `anchors` [A, 4] span every level, `per_level` anchors
// each; per level the scores above score_thresh, the topk_candidates best, their boxes decoded
// by `decode` and clipped to `size`; then batched NMS at nms_thresh and the detections_per_img
// best.
using BoxDecode = std::function<at::Tensor(const at::Tensor& rel_codes, const at::Tensor& boxes)>;
using LevelScores = std::function<at::Tensor(int64_t start, int64_t n)>;
Detections select_detections(const LevelScores& scores, const at::Tensor& regression, const at::Tensor& anchors,
                             const std::vector<int64_t>& per_level, const BoxDecode& decode,
                             std::pair<int64_t, int64_t> size, const DetectorOptions& options);

// What a one-stage head gives over every level of a batch: cls_logits [N, A, C],
// bbox_regression [N, A, 4], bbox_ctrness [N, A, 1] (FCOS; undefined for RetinaNet), the
// anchors [A, 4] and their count per level.
struct HeadOutputs {
  at::Tensor cls_logits, bbox_regression, bbox_ctrness, anchors;
  std::vector<int64_t> per_level;
};

struct PaddedTargets;

// FCOS and RetinaNet around what they share: losses() resizes images and boxes
// (GeneralizedRCNNTransform), runs the network and pads the targets; detect() runs it and
// post-processes each image (select_detections), its boxes mapped back to the image's pixels.
// A detector gives its network's outputs, its loss terms, a level's scores and its box decoder.
class OneStageDetector : public Detector {
 public:
  // `name` ("fcos_resnet50_fpn") names the model in messages and describe().
  OneStageDetector(std::shared_ptr<torch::nn::Module> module, std::string name, const DetectorOptions& options);
  using Detector::losses;
  LossDict losses(const std::vector<at::Tensor>& images, const std::vector<BoxTargets>& targets,
                  int64_t min_size) final;
  std::vector<Detections> detect(const std::vector<at::Tensor>& images) final;
  InputSpec input_spec() const final;
  std::string describe() const final;

 protected:
  virtual HeadOutputs run(const at::Tensor& batch) = 0;
  virtual LossDict loss_terms(const HeadOutputs& out, const PaddedTargets& targets) const = 0;
  // The [count, C] scores of image `image`'s anchors from `start` (one level).
  virtual at::Tensor level_scores(const HeadOutputs& out, int64_t image, int64_t start, int64_t count) const = 0;
  virtual at::Tensor decode(const at::Tensor& rel_codes, const at::Tensor& boxes) const = 0;
  const DetectorOptions o_;

 private:
  std::string name_;
};

// The targets padded into one tensor each: boxes [B, M, 4], labels [B, M], valid [B, M] bool,
// M the most boxes of an image (at least 1).
struct PaddedTargets {
  at::Tensor boxes, labels, valid;
};
PaddedTargets pad_targets(const std::vector<BoxTargets>& targets, const at::TensorOptions& box_options);

}  // namespace crucible::nn::detection
