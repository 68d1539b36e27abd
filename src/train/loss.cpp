// The loss registry: cross_entropy (label smoothing, class weights) and binary_cross_entropy
// (multi-label; label smoothing, class weights).
#include "crucible/train/loss.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"

namespace crucible::train {
namespace {

// loss.class_weights as a [classes] float tensor on the device (undefined when none are given).
at::Tensor class_weights(const LossBuild& b) {
  const std::vector<double>& w = b.options.class_weights;
  if (w.empty()) return {};
  if (static_cast<int64_t>(w.size()) != b.classes) {
    throw bad_input("loss.class_weights: {} weights for {} classes (one per class, in label order)", w.size(),
                    b.classes);
  }
  return at::tensor(w, at::kDouble).to(at::kFloat).to(b.device);
}

std::string weights_text(const std::vector<double>& w) {
  return w.empty() ? "" : fmt::format(", class weights [{}]", fmt::join(w, ", "));
}

// torch.nn.functional.cross_entropy as PyTorch computes it: over class indices, or over class
// probabilities [B, classes] (the soft targets of MixUp/CutMix), label smoothing applied to
// either as torch applies it (probabilities: t (1 - ε) + ε / classes — how torchvision's recipe
// combines the two).
class CrossEntropy final : public Loss {
 public:
  CrossEntropy(const LossBuild& b)
      : smoothing_(b.options.label_smoothing), weights_list_(b.options.class_weights), weights_(class_weights(b)) {
    if (b.multi_label) refuse_multi_label();
  }

  // Multi-label data are refused when the loss is built; [B, C] targets here are probabilities
  // (MixUp/CutMix), float, and taken as torch takes them.
  at::Tensor mean(const at::Tensor& logits, const at::Tensor& targets) const override {
    check(targets);
    return at::cross_entropy_loss(logits, targets, weight(), at::Reduction::Mean, -100, smoothing_);
  }
  at::Tensor per_sample(const at::Tensor& logits, const at::Tensor& targets) const override {
    check(targets);
    return at::cross_entropy_loss(logits, targets, weight(), at::Reduction::None);
  }
  at::Tensor probabilities(const at::Tensor& logits) const override { return at::softmax(logits, 1); }
  std::string describe() const override {
    return fmt::format("cross_entropy (label smoothing {}{})", smoothing_, weights_text(weights_list_));
  }

 private:
  static void check(const at::Tensor& targets) {
    if (targets.dim() == 2 && !targets.is_floating_point()) refuse_multi_label();
  }
  [[noreturn]] static void refuse_multi_label() {
    throw bad_input("loss.name = \"cross_entropy\" takes one class per sample, but the labels are multi-label "
                    "targets [n, classes]: set loss.name = \"binary_cross_entropy\"");
  }
  c10::optional<at::Tensor> weight() const { return weights_.defined() ? c10::optional<at::Tensor>(weights_) : c10::nullopt; }

  double smoothing_;
  std::vector<double> weights_list_;
  at::Tensor weights_;  // undefined: equal weights
};

// torch.nn.functional.binary_cross_entropy_with_logits: an independent sigmoid per class,
// averaged over classes and samples. Multi-label targets are used as they are; class indices
// (single-label data) become one-hot targets. Label smoothing ε moves each target towards 1/2:
// t (1 - ε) + ε / 2. Class weights multiply each class's term (torch's `weight`, broadcast).
class BinaryCrossEntropy final : public Loss {
 public:
  BinaryCrossEntropy(const LossBuild& b)
      : smoothing_(b.options.label_smoothing),
        classes_(b.classes),
        weights_list_(b.options.class_weights),
        weights_(class_weights(b)) {}

  at::Tensor mean(const at::Tensor& logits, const at::Tensor& targets) const override {
    at::Tensor t = dense(logits, targets);
    if (smoothing_ > 0) t = t * (1.0 - smoothing_) + smoothing_ / 2.0;
    return at::binary_cross_entropy_with_logits(logits.to(at::kFloat), t, weight(), {}, at::Reduction::Mean);
  }
  at::Tensor per_sample(const at::Tensor& logits, const at::Tensor& targets) const override {
    return at::binary_cross_entropy_with_logits(logits.to(at::kFloat), dense(logits, targets), weight(), {},
                                                at::Reduction::None)
        .mean(1);
  }
  at::Tensor probabilities(const at::Tensor& logits) const override { return at::sigmoid(logits); }
  std::string describe() const override {
    return fmt::format("binary_cross_entropy (sigmoid per class over {} classes, label smoothing {}{})", classes_,
                       smoothing_, weights_text(weights_list_));
  }

 private:
  // [B, C] float32 targets. The loss is computed in float32 whatever the logits' dtype (bf16
  // under autocast): log(1 + e^-x) of a bf16 logit loses the small losses of confident classes.
  static at::Tensor dense(const at::Tensor& logits, const at::Tensor& targets) {
    if (targets.dim() == 1) return at::one_hot(targets, logits.size(1)).to(at::kFloat);
    return targets.to(at::kFloat);
  }
  c10::optional<at::Tensor> weight() const { return weights_.defined() ? c10::optional<at::Tensor>(weights_) : c10::nullopt; }

  double smoothing_;
  int64_t classes_;
  std::vector<double> weights_list_;
  at::Tensor weights_;
};

}  // namespace

const Registry<LossFactory>& loss_registry() {
  static const Registry<LossFactory> registry = [] {
    Registry<LossFactory> r("loss");
    r.add("cross_entropy", "softmax cross-entropy over class indices (label smoothing, class weights)",
          [](const LossBuild& b) { return std::make_unique<CrossEntropy>(b); });
    r.add("binary_cross_entropy", "a sigmoid per class (multi-label targets, or one-hot of class indices)",
          [](const LossBuild& b) { return std::make_unique<BinaryCrossEntropy>(b); });
    return r;
  }();
  return registry;
}

std::unique_ptr<Loss> make_loss(const LossBuild& build) {
  return loss_registry().get(build.options.name, "loss.name").factory(build);
}

// [B, C] targets: a hit is a predicted class whose target exceeds one half — a positive of
// multi-hot labels, or the class with the larger share of a MixUp/CutMix target (the target's
// argmax, as torchvision's reference counts accuracy, but for an exact 50/50 tie).
at::Tensor top1_hits(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor pick = logits.argmax(1);
  if (targets.dim() == 1) return pick.eq(targets);
  return targets.gather(1, pick.unsqueeze(1)).squeeze(1).gt(0.5);
}

at::Tensor topk_hits(const at::Tensor& logits, const at::Tensor& targets, int64_t k) {
  const at::Tensor top = std::get<1>(logits.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/true));
  if (targets.dim() == 1) return top.eq(targets.unsqueeze(1)).any(1);
  return targets.gather(1, top).gt(0.5).any(1);
}

}  // namespace crucible::train
