// Multi-scale training's setting (M4: train.multi_scale), declared here for the recipe's
// "multi_scale" batch transform (multi_scale.cpp) — inline and torch-free, so that the tools
// that read every key without torch (report, the Python module) see it.
#pragma once

#include <vector>

#include "crucible/core/config.h"

namespace crucible::train {

inline constexpr const char* kMultiScalePiece = "multi_scale";  // its name in the registry
struct MultiScaleOptions {
  // Square input sizes to train at, one per step drawn from (seed, step) — the same on every
  // rank; empty = the data's own size. Evaluation uses the data's size.
  std::vector<double> sizes;
};
inline void declare_settings(ConfigSchema& s, MultiScaleOptions& o) {
  s.add("train", "multi_scale", &o.sizes,
        "M4: square input sizes, one per step drawn from (seed, step), the same on every rank; [] = off");
}

}  // namespace crucible::train
