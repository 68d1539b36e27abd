// GradScaler and finiteness checks.
#include "crucible/train/grad_scaler.h"

#include <ATen/ATen.h>

#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/train/checkpoint.h"

namespace crucible::train {

GradScaler::GradScaler(GradScalerOptions options) : opt_(options), scale_(options.init_scale) {
  if (opt_.init_scale <= 0 || opt_.growth <= 1.0 || opt_.backoff <= 0 || opt_.backoff >= 1.0 || opt_.interval < 1) {
    throw bad_input("grad scaler: need init_scale > 0, growth > 1, 0 < backoff < 1, interval >= 1");
  }
}

at::Tensor GradScaler::scale_loss(const at::Tensor& loss) const { return opt_.enabled ? loss * scale_ : loss; }

void GradScaler::unscale(const std::vector<at::Tensor>& grads) const {
  if (!opt_.enabled) return;
  at::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  for (const auto& g : grads) {
    if (g.defined()) const_cast<at::Tensor&>(g).mul_(inv);
  }
}

bool GradScaler::update(bool found_inf) {
  if (!opt_.enabled) return !found_inf;
  if (found_inf) {
    scale_ *= opt_.backoff;
    tracker_ = 0;
    return false;
  }
  if (++tracker_ == opt_.interval) {
    scale_ *= opt_.growth;
    tracker_ = 0;
  }
  return true;
}

void GradScaler::load(double scale, int64_t tracker) {
  if (!(scale > 0) || tracker < 0) throw bad_input("grad scaler state: scale {} / growth tracker {} invalid", scale, tracker);
  scale_ = scale;
  tracker_ = tracker;
}

void GradScaler::save(CheckpointData& checkpoint) const {
  checkpoint.meta["loss_scale"] = fmt::format("{:.17g}", scale_);
  checkpoint.meta["loss_scale_tracker"] = std::to_string(tracker_);
}

void GradScaler::restore(const CheckpointData& checkpoint, const std::string& path) {
  load(checkpoint.meta_double("loss_scale", path), checkpoint.meta_int("loss_scale_tracker", path));
}

bool all_finite(const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  at::Tensor ok;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    at::Tensor f = at::isfinite(t).all();
    ok = ok.defined() ? at::logical_and(ok, f) : f;
  }
  return !ok.defined() || host_values(ok, HostRead::kStepVote)[0] != 0.0;  // the one host read of the step
}

std::string first_non_finite(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && host_values(at::isfinite(tensors[i]).all(), HostRead::kDiagnosis)[0] == 0.0) {
      return names[i];
    }
  }
  return "";
}

}  // namespace crucible::train
