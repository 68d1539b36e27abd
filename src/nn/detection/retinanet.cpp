// RetinaNet after torchvision/models/detection/retinanet.py (retinanet_resnet50_fpn, v1): the
// heads (four conv3×3-ReLU, Conv2dNormActivation without a norm), 9 anchors per place (sizes
// x, x·2^(1/3), x·2^(2/3) for x = 32 … 512, ratios 0.5, 1, 2), the Matcher (IoU ≥ 0.5
// foreground, < 0.4 background, between ignored; low-quality matches kept), the focal loss
// over the anchors not ignored and the L1 loss of BoxCoder's deltas over the foreground, each
// per image over its foreground count and averaged over the images; postprocess_detections.
// The matching and the losses run on padded targets over the whole batch, without a host read.
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/nn/box_ops.h"
#include "crucible/nn/detection/detector.h"
#include "detection_parts.h"

namespace crucible::nn {
namespace detection {
namespace {

namespace tnn = torch::nn;

constexpr int64_t kAnchors = 9;  // 3 sizes × 3 aspect ratios per place

// Conv2dNormActivation(norm_layer=None): a conv with bias (child "0") and a ReLU ("1").
struct ConvReluImpl : tnn::Module {
  explicit ConvReluImpl(int64_t channels) {
    conv = register_module("0", head_conv(channels, channels, 0));
    register_module("1", tnn::ReLU());
  }
  at::Tensor forward(const at::Tensor& x) { return at::relu(conv(x)); }
  tnn::Conv2d conv{nullptr};
};
TORCH_MODULE(ConvRelu);

// Four of them (names i.0.weight, i.0.bias).
tnn::Sequential tower(int64_t channels) {
  tnn::Sequential seq;
  for (int i = 0; i < 4; ++i) seq->push_back(ConvRelu(channels));
  return seq;
}

struct RegressionHeadImpl : tnn::Module {
  explicit RegressionHeadImpl(int64_t channels) {
    conv = register_module("conv", tower(channels));
    bbox_reg = register_module("bbox_reg", head_conv(channels, kAnchors * 4, 0));
  }
  at::Tensor forward(const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> all;
    for (const auto& f : x) all.push_back(flatten_level(bbox_reg(conv->forward(f)), 4));
    return at::cat(all, 1);
  }
  tnn::Sequential conv{nullptr};
  tnn::Conv2d bbox_reg{nullptr};
};

struct RetinaHeadImpl : tnn::Module {
  RetinaHeadImpl(int64_t channels, int64_t num_classes) {
    classification_head = register_module(
        "classification_head", std::make_shared<ClassificationHeadImpl>(tower(channels), channels, kAnchors, num_classes));
    regression_head = register_module("regression_head", std::make_shared<RegressionHeadImpl>(channels));
  }
  std::shared_ptr<ClassificationHeadImpl> classification_head;
  std::shared_ptr<RegressionHeadImpl> regression_head;
};

struct RetinaNetImpl : tnn::Module {
  RetinaNetImpl(int depth, const DetectorOptions& o) {
    backbone = register_module("backbone", std::make_shared<ResNetFpnImpl>(depth, o.trainable_backbone_layers, o.frozen_norm));
    head = register_module("head", std::make_shared<RetinaHeadImpl>(256, o.num_classes));
  }
  std::shared_ptr<ResNetFpnImpl> backbone;
  std::shared_ptr<RetinaHeadImpl> head;
};

// _default_anchorgen: (x, int(x·2^(1/3)), int(x·2^(2/3))) for x = 32, 64, 128, 256, 512.
std::vector<std::vector<double>> anchor_sizes() {
  std::vector<std::vector<double>> sizes;
  for (double x : {32.0, 64.0, 128.0, 256.0, 512.0}) {
    sizes.push_back({x, std::trunc(x * std::pow(2.0, 1.0 / 3)), std::trunc(x * std::pow(2.0, 2.0 / 3))});
  }
  return sizes;
}

class RetinaNet final : public OneStageDetector {
 public:
  RetinaNet(int depth, const DetectorOptions& o, std::shared_ptr<RetinaNetImpl> impl)
      : OneStageDetector(impl, fmt::format("retinanet_resnet{}_fpn", depth), o), impl_(std::move(impl)) {}

 private:
  HeadOutputs run(const at::Tensor& batch) override {
    const std::vector<at::Tensor> features = impl_->backbone->forward(batch);
    HeadOutputs out;
    out.cls_logits = impl_->head->classification_head->forward(features);
    out.bbox_regression = impl_->head->regression_head->forward(features);
    out.anchors = grid_anchors(batch, features, anchor_sizes(), {0.5, 1.0, 2.0}, &out.per_level);
    return out;
  }

  LossDict loss_terms(const HeadOutputs& out, const PaddedTargets& t) const override {
    return loss(out, t, match(out.anchors, t));
  }

  at::Tensor level_scores(const HeadOutputs& out, int64_t image, int64_t start, int64_t count) const override {
    return at::sigmoid(out.cls_logits[image].narrow(0, start, count));
  }

  at::Tensor decode(const at::Tensor& rel_codes, const at::Tensor& boxes) const override {
    return box_decode(rel_codes, boxes);
  }

  // Matcher(0.5, 0.4, allow_low_quality_matches=True) over box_iou(boxes, anchors), per image:
  // each anchor's best box (ties: the first), -1 below 0.4, -2 between; then every anchor that
  // is some box's best (ties included) takes its best box back. Padded boxes have quality -1:
  // they neither win nor are any anchor's box.
  at::Tensor match(const at::Tensor& anchors, const PaddedTargets& t) const {
    const int64_t b = t.boxes.size(0), m = t.boxes.size(1);
    const at::Tensor iou = box_iou(t.boxes.reshape({b * m, 4}), anchors).view({b, m, -1});  // [B, M, A]
    const at::Tensor valid = t.valid.unsqueeze(2);
    const at::Tensor quality = at::where(valid, iou, at::full({}, -1.0, iou.options()));
    auto [vals, matches] = quality.max(1);  // [B, A]
    const at::Tensor all_matches = matches.clone();
    matches = matches.masked_fill(vals < 0.4, -1).masked_fill((vals >= 0.4) & (vals < 0.5), -2);
    const at::Tensor highest = std::get<0>(quality.max(2)).unsqueeze(2);  // [B, M, 1]
    const at::Tensor best_of_some_box = ((quality == highest) & valid).any(1);  // [B, A]
    return at::where(best_of_some_box, all_matches, matches);
  }

  // RetinaNetHead.compute_loss: per image, the focal loss over the anchors not between the
  // thresholds and the L1 loss of the foreground's deltas, each over max(1, foreground), then
  // the images' mean.
  LossDict loss(const HeadOutputs& out, const PaddedTargets& t, const at::Tensor& matched) const {
    const at::Tensor fg = matched >= 0;
    const at::Tensor counted = matched != -2;
    const at::Tensor index = matched.clamp_min(0);
    const at::Tensor per_image = fg.sum(1).clamp_min(1);  // [B]
    const double images = static_cast<double>(matched.size(0));
    const at::Tensor gt_labels = t.labels.gather(1, index);
    const at::Tensor gt_boxes = t.boxes.gather(1, index.unsqueeze(2).expand({-1, -1, 4}));
    const at::Tensor cls_targets =
        at::one_hot(gt_labels, out.cls_logits.size(2)).to(out.cls_logits.scalar_type()) * fg.unsqueeze(2);
    const at::Tensor zero = at::zeros({}, out.cls_logits.options());
    const at::Tensor focal = at::where(counted.unsqueeze(2), sigmoid_focal_loss(out.cls_logits, cls_targets), zero);
    const at::Tensor loss_cls = (focal.sum({1, 2}) / per_image).sum() / images;
    const at::Tensor anchors = out.anchors.unsqueeze(0).expand({matched.size(0), -1, -1});
    const at::Tensor target = box_encode(gt_boxes, anchors);
    // Background anchors' targets may be infinite (a padded box): replaced before the difference.
    const at::Tensor l1 = at::where(fg.unsqueeze(2), (out.bbox_regression - at::where(fg.unsqueeze(2), target, zero)).abs(),
                                    zero);
    const at::Tensor loss_box = (l1.sum({1, 2}) / per_image).sum() / std::max(1.0, images);
    return {{"classification", loss_cls}, {"bbox_regression", loss_box}};
  }

  std::shared_ptr<RetinaNetImpl> impl_;
};

}  // namespace
}  // namespace detection

std::unique_ptr<Detector> make_retinanet(int depth, const DetectorOptions& o) {
  if (depth != 18 && depth != 34 && depth != 50) {
    throw bad_input("retinanet: unknown depth {} (known: 18, 34, 50)", depth);
  }
  if (o.num_classes < 1) throw bad_input("retinanet: num_classes must be at least 1, found {}", o.num_classes);
  return std::make_unique<detection::RetinaNet>(depth, o, std::make_shared<detection::RetinaNetImpl>(depth, o));
}

}  // namespace crucible::nn
