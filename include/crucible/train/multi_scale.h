// Multi-scale training's setting (M4: train.multi_scale), declared here for the recipe's
// "multi_scale" batch transform (multi_scale.cpp) — inline and torch-free, so that the tools
// that read every key without torch (report, the Python module) see it.
#pragma once

#include <vector>

#include "crucible/core/config.h"

namespace crucible::train {

inline constexpr const char* kMultiScalePiece = "multi_scale";  // its name in the registry
struct MultiScaleOptions {
  // Input sizes to train at, one per step drawn from (seed, step) — the same on every rank: a
  // classifier's square input, a detector's shorter side (its min_size for that step); empty =
  // the data's own size (a detector's model.min_size). Evaluation uses the data's size.
  std::vector<double> sizes;
};
inline void declare_settings(ConfigSchema& s, MultiScaleOptions& o) {
  s.add("train", "multi_scale", &o.sizes,
        "M4: input sizes, one per step drawn from (seed, step), the same on every rank: square for a classifier, "
        "the shorter side (min_size) for a detector; [] = off");
}

}  // namespace crucible::train
