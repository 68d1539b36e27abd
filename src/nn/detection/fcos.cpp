// FCOS after torchvision/models/detection/fcos.py: FCOSHead (classification and regression
// heads, GroupNorm(32) convs), the centre-sampling assignment of FCOS.compute_loss, the loss
// terms of FCOSHead.compute_loss and postprocess_detections. The assignment and the losses run
// on padded targets over the whole batch, without a host read (torchvision loops over images
// and reads the foreground count); they equal torchvision's up to the order of a sum.
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>
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

// GroupNorm computed in float32, as CUDA's autocast computes group_norm (its fp32 list). Under
// CPU bf16 autocast libtorch 1.13's kernel refuses a bf16 input with float weights; the float
// output goes on to the next convolution, which autocast casts again. The same weight and bias.
struct Fp32GroupNormImpl : tnn::GroupNormImpl {
  using tnn::GroupNormImpl::GroupNormImpl;
  at::Tensor forward(const at::Tensor& x) {
    return tnn::GroupNormImpl::forward(x.scalar_type() == at::kFloat ? x : x.to(at::kFloat));
  }
};
TORCH_MODULE(Fp32GroupNorm);

// Four conv3×3-GroupNorm(32)-ReLU, convs drawn from N(0, 0.01) with zero bias (names 0 … 11).
tnn::Sequential head_tower(int64_t channels) {
  tnn::Sequential seq;
  for (int i = 0; i < 4; ++i) {
    seq->push_back(head_conv(channels, channels, 0));
    seq->push_back(Fp32GroupNorm(tnn::GroupNormOptions(32, channels)));
    seq->push_back(tnn::ReLU());
  }
  return seq;
}

struct RegressionHeadImpl : tnn::Module {
  explicit RegressionHeadImpl(int64_t channels) {
    conv = register_module("conv", head_tower(channels));
    bbox_reg = register_module("bbox_reg", head_conv(channels, 4, 0));
    bbox_ctrness = register_module("bbox_ctrness", head_conv(channels, 1, 0));
  }
  std::pair<at::Tensor, at::Tensor> forward(const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> reg, ctr;
    for (const auto& f : x) {
      const at::Tensor feature = conv->forward(f);
      reg.push_back(flatten_level(at::relu(bbox_reg(feature)), 4));
      ctr.push_back(flatten_level(bbox_ctrness(feature), 1));
    }
    return {at::cat(reg, 1), at::cat(ctr, 1)};
  }
  tnn::Sequential conv{nullptr};
  tnn::Conv2d bbox_reg{nullptr}, bbox_ctrness{nullptr};
};

struct FcosHeadImpl : tnn::Module {
  FcosHeadImpl(int64_t channels, int64_t num_classes) {
    classification_head = register_module(
        "classification_head", std::make_shared<ClassificationHeadImpl>(head_tower(channels), channels, 1, num_classes));
    regression_head = register_module("regression_head", std::make_shared<RegressionHeadImpl>(channels));
  }
  std::shared_ptr<ClassificationHeadImpl> classification_head;
  std::shared_ptr<RegressionHeadImpl> regression_head;
};

struct FcosImpl : tnn::Module {
  FcosImpl(int depth, const DetectorOptions& o) {
    backbone = register_module("backbone", std::make_shared<ResNetFpnImpl>(depth, o.trainable_backbone_layers, o.frozen_norm));
    head = register_module("head", std::make_shared<FcosHeadImpl>(256, o.num_classes));
  }
  std::shared_ptr<ResNetFpnImpl> backbone;
  std::shared_ptr<FcosHeadImpl> head;
};

class Fcos final : public OneStageDetector {
 public:
  Fcos(int depth, const DetectorOptions& o, std::shared_ptr<FcosImpl> impl)
      : OneStageDetector(impl, fmt::format("fcos_resnet{}_fpn", depth), o), impl_(std::move(impl)) {}

 private:
  HeadOutputs run(const at::Tensor& batch) override {
    const std::vector<at::Tensor> features = impl_->backbone->forward(batch);
    HeadOutputs out;
    out.cls_logits = impl_->head->classification_head->forward(features);
    std::tie(out.bbox_regression, out.bbox_ctrness) = impl_->head->regression_head->forward(features);
    out.anchors = grid_anchors(batch, features, {{8}, {16}, {32}, {64}, {128}}, {1.0}, &out.per_level);
    return out;
  }

  LossDict loss_terms(const HeadOutputs& out, const PaddedTargets& t) const override {
    return loss(out, t, assign(out, t));  // assign: [B, A], -1 background
  }

  // postprocess_detections: the score of an anchor and class is sqrt(sigmoid(cls) × sigmoid(ctr)).
  at::Tensor level_scores(const HeadOutputs& out, int64_t image, int64_t start, int64_t count) const override {
    return at::sqrt(at::sigmoid(out.cls_logits[image].narrow(0, start, count)) *
                    at::sigmoid(out.bbox_ctrness[image].narrow(0, start, count)));
  }

  at::Tensor decode(const at::Tensor& rel_codes, const at::Tensor& boxes) const override {
    return linear_decode(rel_codes, boxes);
  }

  // FCOS.compute_loss's assignment for every image at once: an anchor point matches a box when
  // it lies within center_sampling_radius strides of the box's centre and inside the box, and
  // its farthest edge is in its level's range (4–8 anchor sizes; the first level from 0, the
  // last without a bound); among matches, the smallest box (the largest 1e8 - area, as
  // torchvision rounds it in float32). Padded boxes never match.
  at::Tensor assign(const HeadOutputs& out, const PaddedTargets& t) const {
    using at::indexing::Slice;
    const at::Tensor& anchors = out.anchors;                                         // [A, 4]
    const at::Tensor gt_centers = (t.boxes.narrow(2, 0, 2) + t.boxes.narrow(2, 2, 2)) / 2;  // [B, M, 2]
    const at::Tensor anchor_centers = (anchors.narrow(1, 0, 2) + anchors.narrow(1, 2, 2)) / 2;  // [A, 2]
    const at::Tensor anchor_sizes = anchors.select(1, 2) - anchors.select(1, 0);                // [A]
    at::Tensor match = (anchor_centers.unsqueeze(0).unsqueeze(2) - gt_centers.unsqueeze(1)).abs_().amax(3) <
                       (o_.center_sampling_radius * anchor_sizes).view({1, -1, 1});  // [B, A, M]
    const at::Tensor x = anchor_centers.select(1, 0).view({1, -1, 1}), y = anchor_centers.select(1, 1).view({1, -1, 1});
    const auto g = t.boxes.unsqueeze(1).unbind(3);  // each [B, 1, M]
    const at::Tensor dist = at::stack({x - g[0], y - g[1], g[2] - x, g[3] - y}, 3);  // [B, A, M, 4]
    match &= dist.amin(3) > 0;
    at::Tensor lower = anchor_sizes * 4;
    lower.index_put_({Slice(0, out.per_level.front())}, 0);
    at::Tensor upper = anchor_sizes * 8;
    upper.index_put_({Slice(-out.per_level.back(), c10::nullopt)}, std::numeric_limits<double>::infinity());
    const at::Tensor far = dist.amax(3);
    match &= (far > lower.view({1, -1, 1})) & (far < upper.view({1, -1, 1}));
    match &= t.valid.unsqueeze(1);
    const at::Tensor areas = (t.boxes.select(2, 2) - t.boxes.select(2, 0)) * (t.boxes.select(2, 3) - t.boxes.select(2, 1));
    const at::Tensor score = match.to(at::kFloat) * (1e8 - areas).unsqueeze(1);  // [B, A, M]
    auto [best, index] = score.max(2);
    return index.masked_fill(best < 1e-5, -1);
  }

  // FCOSHead.compute_loss over the padded batch: sums over the foreground by masks.
  LossDict loss(const HeadOutputs& out, const PaddedTargets& t, const at::Tensor& matched) const {
    const at::Tensor fg = matched >= 0;  // [B, A]
    const at::Tensor index = matched.clamp_min(0);
    const at::Tensor gt_labels = t.labels.gather(1, index);                                         // [B, A]
    const at::Tensor gt_boxes = t.boxes.gather(1, index.unsqueeze(2).expand({-1, -1, 4}));        // [B, A, 4]
    const at::Tensor num_fg = fg.sum().clamp_min(1);
    const at::Tensor cls_targets =
        at::one_hot(gt_labels, out.cls_logits.size(2)).to(out.cls_logits.scalar_type()) * fg.unsqueeze(2);
    const at::Tensor loss_cls = sigmoid_focal_loss(out.cls_logits, cls_targets).sum();
    const at::Tensor anchors = out.anchors.unsqueeze(0).expand({matched.size(0), -1, -1});
    const at::Tensor pred_boxes = linear_decode(out.bbox_regression, anchors);
    const at::Tensor zero = at::zeros({}, pred_boxes.options());
    const at::Tensor loss_box = at::where(fg, generalized_box_iou_loss(pred_boxes, gt_boxes), zero).sum();
    const at::Tensor reg_targets = linear_encode(anchors, gt_boxes);
    const at::Tensor lr = reg_targets.index_select(-1, at::tensor(std::vector<int64_t>{0, 2}).to(matched.device()));
    const at::Tensor tb = reg_targets.index_select(-1, at::tensor(std::vector<int64_t>{1, 3}).to(matched.device()));
    const at::Tensor ctr_targets =
        at::sqrt((std::get<0>(lr.min(-1)) / std::get<0>(lr.max(-1))) * (std::get<0>(tb.min(-1)) / std::get<0>(tb.max(-1))));
    const at::Tensor pred_ctr = out.bbox_ctrness.squeeze(2);
    // Background anchors' centreness targets may be 0/0: they are replaced before the loss.
    const at::Tensor bce = at::binary_cross_entropy_with_logits(pred_ctr, at::where(fg, ctr_targets, zero), {}, {},
                                                                at::Reduction::None);
    const at::Tensor loss_ctr = at::where(fg, bce, zero).sum();
    return {{"classification", loss_cls / num_fg}, {"bbox_regression", loss_box / num_fg},
            {"bbox_ctrness", loss_ctr / num_fg}};
  }

  std::shared_ptr<FcosImpl> impl_;
};

}  // namespace
}  // namespace detection

std::unique_ptr<Detector> make_fcos(int depth, const DetectorOptions& o) {
  if (depth != 18 && depth != 34 && depth != 50) throw bad_input("fcos: unknown depth {} (known: 18, 34, 50)", depth);
  if (o.num_classes < 1) throw bad_input("fcos: num_classes must be at least 1, found {}", o.num_classes);
  return std::make_unique<detection::Fcos>(depth, o, std::make_shared<detection::FcosImpl>(depth, o));
}

}  // namespace crucible::nn
