// The [optim] section: the keys every optimizer reads, and each optimizer's own (one entry per
// optimizer; its update rule is in optimizer.cpp, under the same name).
#include "crucible/train/optim_options.h"

#include "crucible/core/config.h"

namespace crucible::train {
namespace {

void declare_adamw(OptimOptions& o, ConfigSchema& s) {
  s.add("optim", "beta1", &o.beta1, "adamw beta1 (cycled by onecycle when cycle_momentum)").min(0).max(1, true);
  s.add("optim", "beta2", &o.beta2, "adamw beta2").min(0).max(1, true);
  s.add("optim", "eps", &o.eps, "adamw epsilon").positive();
}

void declare_sgd(OptimOptions& o, ConfigSchema& s) {
  s.add("optim", "momentum", &o.momentum, "sgd momentum").min(0).max(1, true);
  s.add("optim", "nesterov", &o.nesterov, "sgd Nesterov momentum");
}

}  // namespace

const Registry<OptimizerSettings>& optimizer_settings_registry() {
  static const Registry<OptimizerSettings> registry = [] {
    Registry<OptimizerSettings> r("optimizer");
    r.add("adamw", "AdamW (decoupled weight decay), torch.optim.AdamW's update", {declare_adamw});
    r.add("sgd", "SGD with (Nesterov) momentum, torch.optim.SGD's update", {declare_sgd});
    return r;
  }();
  return registry;
}

void declare_optim_settings(OptimOptions& o, ConfigSchema& s) {
  s.add("optim", "name", &o.name, "optimizer").choices(optimizer_settings_registry().names());
  s.add("optim", "lr", &o.lr, "peak learning rate").positive();
  s.add("optim", "lr_per_256", &o.lr_per_256, "if > 0: lr per 256 samples, scaled by the global batch (T7)")
      .non_negative();
  s.add("optim", "decay_bias_and_norm", &o.decay_bias_and_norm,
        "also decay biases and normalisation weights (T4: off by default)");
  s.add("optim", "weight_decay", &o.weight_decay, "weight decay (decoupled for adamw)").non_negative();
  for (const auto& e : optimizer_settings_registry().entries()) e.factory.declare(o, s);
}

}  // namespace crucible::train
