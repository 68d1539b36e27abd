// Optimizer options, torch-free (the optimizers are in train/optimizer.h). The [optim] keys
// every optimizer reads are declared here; each optimizer declares its own in its entry of
// optimizer_settings_registry() (optim_options.cpp), whose names are optimizer_registry()'s
// (the torch side, which the torch-free tools do not link; tests/train/run_state_test.cpp
// holds the two to the same names).
#pragma once

#include <functional>
#include <string>

#include "crucible/core/registry.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::train {

struct OptimOptions {
  std::string name = "adamw";  // "adamw" | "sgd"
  double lr = 2e-3;            // peak learning rate
  double lr_per_256 = 0.0;     // T7: if > 0, lr = lr_per_256 × global batch / 256 (replaces lr)
  bool decay_bias_and_norm = false;  // T4: weight decay on biases and norm weights too
  double weight_decay = 5e-4;  // decoupled for AdamW, L2 for SGD
  double beta1 = 0.9;          // AdamW
  double beta2 = 0.999;        // AdamW
  double eps = 1e-8;           // AdamW
  double momentum = 0.9;       // SGD
  bool nesterov = true;        // SGD
};

// An optimizer's own keys of [optim] (a key two optimizers share: declared by the first).
struct OptimizerSettings {
  std::function<void(OptimOptions& options, ConfigSchema& schema)> declare;
};
// Every optimizer by name, in optim.name's order: optim.name's allowed values.
const Registry<OptimizerSettings>& optimizer_settings_registry();

// Binds [optim]: the name, the keys every optimizer reads, then each optimizer's own.
void declare_optim_settings(OptimOptions& options, ConfigSchema& schema);

}  // namespace crucible::train
