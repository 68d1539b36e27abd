// Optimizer options, torch-free (the optimizers are in train/optimizer.h).
#pragma once

#include <string>

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

}  // namespace crucible::train
