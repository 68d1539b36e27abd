// The weight EMA's settings (train.ema, train.ema_decay, train.ema_steps, train.ema_adjust:
// torchvision's --model-ema*), declared here for the step observer that keeps the average
// (ema.cpp) — inline and torch-free, so that the tools that read every key without torch
// (report, the Python module) see them.
#pragma once

#include <cstdint>

#include "crucible/core/config.h"

namespace crucible::train {

inline constexpr const char* kEmaPiece = "ema";  // its name in the registry
struct EmaOptions {
  bool enabled = false;     // train.ema
  double decay = 0.99998;   // train.ema_decay [--model-ema-decay]
  int64_t steps = 32;       // train.ema_steps [--model-ema-steps]
  bool adjust = true;       // train.ema_adjust: decay adjusted as train.py does
};
inline void declare_settings(ConfigSchema& s, EmaOptions& o) {
  s.add("train", "ema", &o.enabled,
        "keep an exponential moving average of the weights (parameters and BatchNorm buffers), torchvision's "
        "--model-ema: evaluated after every epoch (test_acc_ema), in every checkpoint, eval/predict --weights ema; "
        "during schedule.warmup_epochs each update copies the weights");
  s.add("train", "ema_decay", &o.decay,
        "EMA decay per update before ema_adjust (--model-ema-decay): avg = decay × avg + (1 − decay) × model")
      .min(0)
      .max(1);
  s.add("train", "ema_steps", &o.steps,
        "update the EMA after the optimizer step of every Nth batch of an epoch, from its first (--model-ema-steps)")
      .min(1);
  s.add("train", "ema_adjust", &o.adjust,
        "adjust ema_decay as torchvision's train.py does, for the samples between updates: decay = 1 − min(1, (1 − "
        "ema_decay) × world size × batch_size × ema_steps / epochs); false = ema_decay as given");
}

}  // namespace crucible::train
