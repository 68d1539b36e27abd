// torchvision's detection parts (see detection_parts.h), each after its Python source:
// models/detection/transform.py, ops/feature_pyramid_network.py, backbone_utils.py,
// anchor_utils.py, _utils.py (BoxLinearCoder), ops/focal_loss.py, ops/giou_loss.py.
#include "detection_parts.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/nn/box_ops.h"
#include "crucible/nn/resnet.h"

namespace crucible::nn {

at::Tensor Detector::forward(const at::Tensor& /*x*/) {
  throw bad_input("{}: a detector takes a list of images with their boxes (losses, detect), not one tensor",
                  describe());
}

}  // namespace crucible::nn

namespace crucible::nn::detection {
namespace tnn = torch::nn;

// ---- one-stage detectors ----

OneStageDetector::OneStageDetector(std::shared_ptr<torch::nn::Module> module, std::string name,
                                   const DetectorOptions& options)
    : Detector(std::move(module)), o_(options), name_(std::move(name)) {}

LossDict OneStageDetector::losses(const std::vector<at::Tensor>& images, const std::vector<BoxTargets>& targets,
                                  int64_t min_size) {
  if (targets.size() != images.size()) {
    throw bad_input("{}: {} images with {} targets; one target per image", name_, images.size(), targets.size());
  }
  if (min_size < 0) throw bad_input("{}: min_size {}; expected a size in pixels, or 0 for the model's", name_, min_size);
  std::vector<BoxTargets> resized = targets;
  const ImageList batch = transform_images(images, o_, &resized, min_size);
  const HeadOutputs out = run(batch.tensors);
  return loss_terms(out, pad_targets(resized, out.bbox_regression.options()));
}

std::vector<Detections> OneStageDetector::detect(const std::vector<at::Tensor>& images) {
  const ImageList batch = transform_images(images, o_, nullptr);
  const HeadOutputs out = run(batch.tensors);
  std::vector<Detections> result;
  for (size_t i = 0; i < images.size(); ++i) {
    const auto n = static_cast<int64_t>(i);
    const auto scores = [&](int64_t start, int64_t count) { return level_scores(out, n, start, count); };
    const auto decoder = [this](const at::Tensor& codes, const at::Tensor& boxes) { return decode(codes, boxes); };
    Detections d = select_detections(scores, out.bbox_regression[n], out.anchors, out.per_level, decoder,
                                     batch.sizes[i], o_);
    d.boxes = resize_boxes(d.boxes, batch.sizes[i], {images[i].size(1), images[i].size(2)});
    result.push_back(std::move(d));
  }
  return result;
}

InputSpec OneStageDetector::input_spec() const {
  // 0–1 RGB: GeneralizedRCNNTransform normalises inside, with image_mean and image_std.
  return {3, o_.min_size, o_.min_size, data::ColorOrder::kRGB, {0.0, 0.0, 0.0}, {1.0, 1.0, 1.0}};
}

std::string OneStageDetector::describe() const {
  // M2 for detection: which norm the trunk has and which stages train, stated in the log.
  return fmt::format("{} ({} classes, min_size {}, max_size {}; trunk {}, {} of 5 stages trained{})", name_,
                     o_.num_classes, o_.min_size, o_.max_size, o_.frozen_norm ? "FrozenBatchNorm2d" : "BatchNorm2d",
                     o_.trainable_backbone_layers,
                     o_.frozen_norm ? ", statistics fixed" : ", statistics from each rank's batches");
}

// ---- GeneralizedRCNNTransform ----

namespace {

// _resize_image_and_masks without fixed_size: scale = min(min_size / shorter, max_size / longer),
// and F.interpolate(recompute_scale_factor=True) floors size × scale, then resizes to that size.
at::Tensor resize_image(const at::Tensor& image, int64_t min_size, int64_t max_size) {
  const int64_t h = image.size(-2), w = image.size(-1);
  const double scale = std::min(static_cast<double>(min_size) / static_cast<double>(std::min(h, w)),
                                static_cast<double>(max_size) / static_cast<double>(std::max(h, w)));
  const auto out_h = static_cast<int64_t>(std::floor(static_cast<double>(h) * scale));
  const auto out_w = static_cast<int64_t>(std::floor(static_cast<double>(w) * scale));
  return at::upsample_bilinear2d(image.unsqueeze(0), {out_h, out_w}, /*align_corners=*/false, c10::nullopt,
                                 c10::nullopt)
      .squeeze(0);
}

}  // namespace

at::Tensor resize_boxes(const at::Tensor& boxes, std::pair<int64_t, int64_t> from, std::pair<int64_t, int64_t> to) {
  // float32 ratios, as torch.tensor(s, dtype=float32) / torch.tensor(s_orig, dtype=float32).
  const double ratio_h = static_cast<double>(static_cast<float>(to.first) / static_cast<float>(from.first));
  const double ratio_w = static_cast<double>(static_cast<float>(to.second) / static_cast<float>(from.second));
  const auto xyxy = boxes.unbind(1);
  return at::stack({xyxy[0] * ratio_w, xyxy[1] * ratio_h, xyxy[2] * ratio_w, xyxy[3] * ratio_h}, 1);
}

at::Tensor clip_boxes_to_image(const at::Tensor& boxes, std::pair<int64_t, int64_t> size) {
  using at::indexing::Slice;
  const at::Tensor x = boxes.index({"...", Slice(0, c10::nullopt, 2)}).clamp(0, static_cast<double>(size.second));
  const at::Tensor y = boxes.index({"...", Slice(1, c10::nullopt, 2)}).clamp(0, static_cast<double>(size.first));
  return at::stack({x, y}, boxes.dim()).reshape(boxes.sizes());
}

ImageList transform_images(const std::vector<at::Tensor>& images, const DetectorOptions& o,
                           std::vector<BoxTargets>* targets, int64_t min_size) {
  if (images.empty()) throw bad_input("detector: no images given");
  std::vector<at::Tensor> resized;
  ImageList out;
  int64_t max_h = 0, max_w = 0, channels = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& image = images[i];
    if (image.dim() != 3 || !image.is_floating_point()) {
      throw bad_input("detector: image {} is [{}] {}; expected [C, H, W] floating point in 0–1", i,
                      fmt::join(image.sizes(), ", "), c10::toString(image.scalar_type()));
    }
    const at::Tensor mean = at::tensor(o.image_mean, at::kDouble).to(image.options());
    const at::Tensor std = at::tensor(o.image_std, at::kDouble).to(image.options());
    at::Tensor x = (image - mean.view({-1, 1, 1})) / std.view({-1, 1, 1});
    const std::pair<int64_t, int64_t> before{x.size(1), x.size(2)};
    x = resize_image(x, min_size > 0 ? min_size : o.min_size, o.max_size);
    const std::pair<int64_t, int64_t> after{x.size(1), x.size(2)};
    if (targets != nullptr) (*targets)[i].boxes = resize_boxes((*targets)[i].boxes, before, after);
    out.sizes.push_back(after);
    max_h = std::max(max_h, after.first);
    max_w = std::max(max_w, after.second);
    channels = std::max(channels, x.size(0));
    resized.push_back(std::move(x));
  }
  // batch_images: the largest size rounded up to a multiple of 32, zeros beyond each image.
  const auto up = [](int64_t v) { return static_cast<int64_t>(std::ceil(static_cast<double>(v) / 32.0) * 32.0); };
  out.tensors = at::zeros({static_cast<int64_t>(resized.size()), channels, up(max_h), up(max_w)}, resized[0].options());
  using at::indexing::Slice;
  for (size_t i = 0; i < resized.size(); ++i) {
    const at::Tensor& r = resized[i];
    out.tensors[static_cast<int64_t>(i)]
        .index({Slice(0, r.size(0)), Slice(0, r.size(1)), Slice(0, r.size(2))})
        .copy_(r);
  }
  return out;
}

// ---- FPN ----

namespace {

tnn::Conv2d fpn_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  tnn::Conv2d conv(tnn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
  tnn::init::kaiming_uniform_(conv->weight, /*a=*/1);
  tnn::init::constant_(conv->bias, 0);
  return conv;
}

}  // namespace

FpnImpl::FpnImpl(const std::vector<int64_t>& in_channels, int64_t out_channels) {
  for (int64_t in : in_channels) {
    // Conv2dNormActivation without norm and activation: a Sequential of one conv (names i.0).
    inner_blocks->push_back(tnn::Sequential(fpn_conv(in, out_channels, 1, 1, 0)));
    layer_blocks->push_back(tnn::Sequential(fpn_conv(out_channels, out_channels, 3, 1, 1)));
  }
  register_module("inner_blocks", inner_blocks);
  register_module("layer_blocks", layer_blocks);
  extra_blocks = std::make_shared<tnn::Module>();
  p6 = extra_blocks->register_module("p6", fpn_conv(out_channels, out_channels, 3, 2, 1));
  p7 = extra_blocks->register_module("p7", fpn_conv(out_channels, out_channels, 3, 2, 1));
  register_module("extra_blocks", extra_blocks);
}

std::vector<at::Tensor> FpnImpl::forward(const std::vector<at::Tensor>& x) {
  const auto n = static_cast<int64_t>(x.size());
  const auto inner = [&](int64_t i, const at::Tensor& t) { return inner_blocks[i]->as<tnn::Sequential>()->forward(t); };
  const auto outer = [&](int64_t i, const at::Tensor& t) { return layer_blocks[i]->as<tnn::Sequential>()->forward(t); };
  at::Tensor last_inner = inner(n - 1, x.back());
  std::vector<at::Tensor> results = {outer(n - 1, last_inner)};
  for (int64_t idx = n - 2; idx >= 0; --idx) {
    const at::Tensor lateral = inner(idx, x[idx]);
    const at::Tensor top_down =
        at::upsample_nearest2d(last_inner, {lateral.size(-2), lateral.size(-1)}, c10::nullopt, c10::nullopt);
    last_inner = lateral + top_down;
    results.insert(results.begin(), outer(idx, last_inner));
  }
  // LastLevelP6P7(256, 256): in_channels == out_channels, so P6 comes from P5.
  const at::Tensor p6_out = p6(results.back());
  const at::Tensor p7_out = p7(at::relu(p6_out));
  results.push_back(p6_out);
  results.push_back(p7_out);
  return results;
}

ResNetFpnImpl::ResNetFpnImpl(int depth, int64_t trainable_layers, bool frozen_norm) {
  if (trainable_layers < 0 || trainable_layers > 5) {
    throw bad_input("model.trainable_backbone_layers: expected 0 to 5 (trunk stages trained, from the last), found {}",
                    trainable_layers);
  }
  body = register_module("body", make_resnet_trunk(depth, frozen_norm));
  const int64_t c5 = depth == 50 ? 2048 : 512;  // layer4's channels; layer2 and layer3 have a quarter, a half
  fpn = register_module("fpn", std::make_shared<FpnImpl>(std::vector<int64_t>{c5 / 4, c5 / 2, c5}, 256));
  // _resnet_fpn_extractor: parameters outside the last `trainable_layers` stages stop their gradient.
  const std::vector<std::string> stages = {"layer4", "layer3", "layer2", "layer1", "conv1"};
  std::vector<std::string> train(stages.begin(), stages.begin() + trainable_layers);
  if (trainable_layers == 5) train.push_back("bn1");
  for (auto& p : body->named_parameters()) {
    const bool trained = std::any_of(train.begin(), train.end(), [&](const std::string& s) {
      return p.key().rfind(s, 0) == 0;
    });
    if (!trained) p.value().set_requires_grad(false);
  }
}

std::vector<at::Tensor> ResNetFpnImpl::forward(const at::Tensor& x) {
  const std::vector<at::Tensor> c = resnet_trunk_stages(*body, x);
  return fpn->forward({c[1], c[2], c[3]});
}

// ---- heads ----

tnn::Conv2d head_conv(int64_t in, int64_t out, double bias) {
  tnn::Conv2d conv(tnn::Conv2dOptions(in, out, 3).padding(1));
  tnn::init::normal_(conv->weight, 0, 0.01);
  tnn::init::constant_(conv->bias, bias);
  return conv;
}

at::Tensor flatten_level(const at::Tensor& t, int64_t k) {
  const int64_t n = t.size(0), h = t.size(2), w = t.size(3);
  return t.view({n, -1, k, h, w}).permute({0, 3, 4, 1, 2}).reshape({n, -1, k});
}

double prior_bias() {
  const double prior = 0.01;
  return -std::log((1 - prior) / prior);
}

ClassificationHeadImpl::ClassificationHeadImpl(tnn::Sequential tower, int64_t channels, int64_t anchors,
                                               int64_t num_classes)
    : num_classes(num_classes) {
  conv = register_module("conv", std::move(tower));
  cls_logits = register_module("cls_logits", head_conv(channels, anchors * num_classes, prior_bias()));
}

at::Tensor ClassificationHeadImpl::forward(const std::vector<at::Tensor>& x) {
  std::vector<at::Tensor> all;
  for (const auto& f : x) all.push_back(flatten_level(cls_logits(conv->forward(f)), num_classes));
  return at::cat(all, 1);
}

// ---- anchors, box coder, losses ----

at::Tensor grid_anchors(const at::Tensor& batch, const std::vector<at::Tensor>& features,
                        const std::vector<std::vector<double>>& sizes, const std::vector<double>& aspect_ratios,
                        std::vector<int64_t>* per_level) {
  const auto opts = features[0].options();
  std::vector<at::Tensor> levels;
  for (size_t l = 0; l < features.size(); ++l) {
    const int64_t gh = features[l].size(-2), gw = features[l].size(-1);
    const int64_t sh = batch.size(-2) / gh, sw = batch.size(-1) / gw;
    // generate_anchors: hs = sqrt(ratio) × size, ws = size / sqrt(ratio), [-ws, -hs, ws, hs] / 2 rounded.
    const at::Tensor scales = at::tensor(sizes[l], at::kDouble).to(at::kFloat);
    const at::Tensor ratios = at::tensor(aspect_ratios, at::kDouble).to(at::kFloat);
    const at::Tensor h_ratios = at::sqrt(ratios);
    const at::Tensor w_ratios = 1 / h_ratios;
    const at::Tensor ws = (w_ratios.unsqueeze(1) * scales.unsqueeze(0)).view(-1);
    const at::Tensor hs = (h_ratios.unsqueeze(1) * scales.unsqueeze(0)).view(-1);
    const at::Tensor base = (at::stack({-ws, -hs, ws, hs}, 1) / 2).round().to(opts);
    const at::Tensor shifts_x = at::arange(gw, opts.dtype(at::kInt)) * sw;
    const at::Tensor shifts_y = at::arange(gh, opts.dtype(at::kInt)) * sh;
    const auto grid = at::meshgrid({shifts_y, shifts_x}, "ij");
    const at::Tensor sx = grid[1].reshape(-1), sy = grid[0].reshape(-1);
    const at::Tensor shifts = at::stack({sx, sy, sx, sy}, 1);
    levels.push_back((shifts.view({-1, 1, 4}) + base.view({1, -1, 4})).reshape({-1, 4}));
    if (per_level != nullptr) per_level->push_back(levels.back().size(0));
  }
  return at::cat(levels);
}

at::Tensor linear_encode(const at::Tensor& reference, const at::Tensor& proposals) {
  using at::indexing::Ellipsis;
  const auto r = [&](int64_t i) { return reference.index({Ellipsis, i}); };
  const auto p = [&](int64_t i) { return proposals.index({Ellipsis, i}); };
  const at::Tensor ctr_x = 0.5 * (r(0) + r(2));
  const at::Tensor ctr_y = 0.5 * (r(1) + r(3));
  const at::Tensor targets = at::stack({ctr_x - p(0), ctr_y - p(1), p(2) - ctr_x, p(3) - ctr_y}, -1);
  const at::Tensor w = r(2) - r(0), h = r(3) - r(1);
  return targets / at::stack({w, h, w, h}, -1);
}

at::Tensor linear_decode(const at::Tensor& rel_codes, const at::Tensor& reference) {
  using at::indexing::Ellipsis;
  const at::Tensor boxes = reference.to(rel_codes.scalar_type());
  const auto b = [&](int64_t i) { return boxes.index({Ellipsis, i}); };
  const at::Tensor ctr_x = 0.5 * (b(0) + b(2));
  const at::Tensor ctr_y = 0.5 * (b(1) + b(3));
  const at::Tensor w = b(2) - b(0), h = b(3) - b(1);
  const at::Tensor codes = rel_codes * at::stack({w, h, w, h}, -1);
  const auto c = [&](int64_t i) { return codes.index({Ellipsis, i}); };
  return at::stack({ctr_x - c(0), ctr_y - c(1), ctr_x + c(2), ctr_y + c(3)}, -1);
}

at::Tensor box_encode(const at::Tensor& reference, const at::Tensor& proposals) {
  // encode_boxes with weights 1: ex_* from the proposals (anchors), gt_* from the reference.
  using at::indexing::Ellipsis;
  const auto p = [&](int64_t i) { return proposals.index({Ellipsis, i}); };
  const auto r = [&](int64_t i) { return reference.index({Ellipsis, i}); };
  const at::Tensor ex_w = p(2) - p(0), ex_h = p(3) - p(1);
  const at::Tensor ex_x = p(0) + 0.5 * ex_w, ex_y = p(1) + 0.5 * ex_h;
  const at::Tensor gt_w = r(2) - r(0), gt_h = r(3) - r(1);
  const at::Tensor gt_x = r(0) + 0.5 * gt_w, gt_y = r(1) + 0.5 * gt_h;
  return at::stack({(gt_x - ex_x) / ex_w, (gt_y - ex_y) / ex_h, at::log(gt_w / ex_w), at::log(gt_h / ex_h)}, -1);
}

at::Tensor box_decode(const at::Tensor& rel_codes, const at::Tensor& reference) {
  using at::indexing::Ellipsis;
  const at::Tensor boxes = reference.to(rel_codes.scalar_type());
  const auto b = [&](int64_t i) { return boxes.index({Ellipsis, i}); };
  const auto c = [&](int64_t i) { return rel_codes.index({Ellipsis, i}); };
  const at::Tensor widths = b(2) - b(0), heights = b(3) - b(1);
  const at::Tensor ctr_x = b(0) + 0.5 * widths, ctr_y = b(1) + 0.5 * heights;
  const double clip = std::log(1000.0 / 16);
  const at::Tensor dw = c(2).clamp_max(clip), dh = c(3).clamp_max(clip);
  const at::Tensor pred_x = c(0) * widths + ctr_x, pred_y = c(1) * heights + ctr_y;
  const at::Tensor half_w = 0.5 * (at::exp(dw) * widths), half_h = 0.5 * (at::exp(dh) * heights);
  return at::stack({pred_x - half_w, pred_y - half_h, pred_x + half_w, pred_y + half_h}, -1);
}

Detections select_detections(const LevelScores& scores, const at::Tensor& regression, const at::Tensor& anchors,
                             const std::vector<int64_t>& per_level, const BoxDecode& decode,
                             std::pair<int64_t, int64_t> size, const DetectorOptions& o) {
  std::vector<at::Tensor> boxes, kept_scores, labels;
  int64_t start = 0;
  int64_t classes = 0;
  for (int64_t n : per_level) {
    const at::Tensor level = scores(start, n);
    classes = level.size(1);
    at::Tensor s = level.flatten();
    const at::Tensor reg = regression.narrow(0, start, n);
    const at::Tensor level_anchors = anchors.narrow(0, start, n);
    start += n;
    const at::Tensor keep = s > o.score_thresh;
    s = s.index({keep});
    at::Tensor topk_idxs = at::where(keep)[0];
    const int64_t k = std::min(o.topk_candidates, topk_idxs.size(0));
    auto [top_scores, idxs] = s.topk(k);
    topk_idxs = topk_idxs.index({idxs});
    const at::Tensor anchor_idxs = at::div(topk_idxs, classes, "floor");
    labels.push_back(topk_idxs % classes);
    boxes.push_back(clip_boxes_to_image(decode(reg.index({anchor_idxs}), level_anchors.index({anchor_idxs})), size));
    kept_scores.push_back(top_scores);
  }
  const at::Tensor all_boxes = at::cat(boxes), all_scores = at::cat(kept_scores), all_labels = at::cat(labels);
  at::Tensor order = batched_nms(all_boxes, all_scores, all_labels, o.nms_thresh);
  order = order.narrow(0, 0, std::min(o.detections_per_img, order.size(0)));
  return {all_boxes.index({order}), all_scores.index({order}), all_labels.index({order})};
}

at::Tensor sigmoid_focal_loss(const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma) {
  const at::Tensor p = at::sigmoid(inputs);
  const at::Tensor ce = at::binary_cross_entropy_with_logits(inputs, targets, {}, {}, at::Reduction::None);
  const at::Tensor p_t = p * targets + (1 - p) * (1 - targets);
  at::Tensor loss = ce * at::pow(1 - p_t, gamma);
  if (alpha >= 0) loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss;
  return loss;
}

at::Tensor generalized_box_iou_loss(const at::Tensor& boxes1, const at::Tensor& boxes2, double eps) {
  const auto a = boxes1.unbind(-1), g = boxes2.unbind(-1);
  // _loss_inter_union: the intersection where it is not empty (a where instead of an indexed
  // write: the same values, no data-dependent shape).
  const at::Tensor xk1 = at::max(a[0], g[0]), yk1 = at::max(a[1], g[1]);
  const at::Tensor xk2 = at::min(a[2], g[2]), yk2 = at::min(a[3], g[3]);
  const at::Tensor overlap = (yk2 > yk1) & (xk2 > xk1);
  const at::Tensor inter = at::where(overlap, (xk2 - xk1) * (yk2 - yk1), at::zeros_like(a[0]));
  const at::Tensor uni = (a[2] - a[0]) * (a[3] - a[1]) + (g[2] - g[0]) * (g[3] - g[1]) - inter;
  const at::Tensor iou = inter / (uni + eps);
  const at::Tensor area_c = (at::max(a[2], g[2]) - at::min(a[0], g[0])) * (at::max(a[3], g[3]) - at::min(a[1], g[1]));
  return 1 - (iou - ((area_c - uni) / (area_c + eps)));
}

PaddedTargets pad_targets(const std::vector<BoxTargets>& targets, const at::TensorOptions& box_options) {
  int64_t m = 1;
  for (const auto& t : targets) m = std::max(m, t.boxes.size(0));
  const auto b = static_cast<int64_t>(targets.size());
  PaddedTargets out{at::zeros({b, m, 4}, box_options), at::zeros({b, m}, box_options.dtype(at::kLong)),
                    at::zeros({b, m}, box_options.dtype(at::kBool))};
  using at::indexing::Slice;
  for (int64_t i = 0; i < b; ++i) {
    const BoxTargets& t = targets[static_cast<size_t>(i)];
    const int64_t n = t.boxes.size(0);
    if (t.boxes.dim() != 2 || t.boxes.size(1) != 4 || t.labels.dim() != 1 || t.labels.size(0) != n) {
      throw bad_input("detector: image {}'s targets are boxes [{}] and labels [{}]; expected [n, 4] and [n]", i,
                      fmt::join(t.boxes.sizes(), ", "), fmt::join(t.labels.sizes(), ", "));
    }
    if (n == 0) continue;
    out.boxes[i].index({Slice(0, n)}).copy_(t.boxes);
    out.labels[i].index({Slice(0, n)}).copy_(t.labels);
    out.valid[i].index({Slice(0, n)}).fill_(true);
  }
  return out;
}

}  // namespace crucible::nn::detection
