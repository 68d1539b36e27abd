// The loss registry: cross_entropy (label smoothing, class weights).
#include "crucible/train/loss.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"

namespace crucible::train {
namespace {

// torch.nn.functional.cross_entropy over class indices, as PyTorch computes it.
class CrossEntropy final : public Loss {
 public:
  CrossEntropy(const LossBuild& b) : smoothing_(b.options.label_smoothing), weights_list_(b.options.class_weights) {
    if (!weights_list_.empty()) {
      if (static_cast<int64_t>(weights_list_.size()) != b.classes) {
        throw bad_input("loss.class_weights: {} weights for {} classes (one per class, in label order)",
                        weights_list_.size(), b.classes);
      }
      weights_ = at::tensor(weights_list_, at::kDouble).to(at::kFloat).to(b.device);
    }
  }

  at::Tensor mean(const at::Tensor& logits, const at::Tensor& targets) const override {
    return at::cross_entropy_loss(logits, targets, weight(), at::Reduction::Mean, -100, smoothing_);
  }
  at::Tensor per_sample(const at::Tensor& logits, const at::Tensor& targets) const override {
    return at::cross_entropy_loss(logits, targets, weight(), at::Reduction::None);
  }
  std::string describe() const override {
    return fmt::format("cross_entropy (label smoothing {}{})", smoothing_,
                       weights_list_.empty() ? "" : fmt::format(", class weights [{}]", fmt::join(weights_list_, ", ")));
  }

 private:
  c10::optional<at::Tensor> weight() const { return weights_.defined() ? c10::optional<at::Tensor>(weights_) : c10::nullopt; }

  double smoothing_;
  std::vector<double> weights_list_;
  at::Tensor weights_;  // undefined: equal weights
};

}  // namespace

const Registry<LossFactory>& loss_registry() {
  static const Registry<LossFactory> registry = [] {
    Registry<LossFactory> r("loss");
    r.add("cross_entropy", "softmax cross-entropy over class indices (label smoothing, class weights)",
          [](const LossBuild& b) { return std::make_unique<CrossEntropy>(b); });
    return r;
  }();
  return registry;
}

std::unique_ptr<Loss> make_loss(const LossBuild& build) {
  return loss_registry().get(build.options.name, "loss.name").factory(build);
}

}  // namespace crucible::train
