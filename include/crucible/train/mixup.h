// MixUp and CutMix (data.mixup_alpha, data.cutmix_alpha) and random erasing (data.random_erase) as
// batch transforms, equal to torchvision.transforms.v2's MixUp/CutMix (chosen per batch by
// RandomChoice when both are set, as references/classification/train.py does) and RandomErasing.
// The draws are pure, torch-free functions (data/batch_draws.h): MixUp/CutMix of (seed, step,
// rank), erasing of (seed, epoch, sample index) — a resumed or rerun step draws what it drew before.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "crucible/core/config.h"
#include "crucible/data/batch_draws.h"

namespace crucible::train {

// The pieces' settings (recipe.cpp's "random_erase" and "mixup_cutmix"), declared here — inline,
// so that the torch-free tools that read every key (report, the Python module) see them.
inline constexpr const char* kRandomErasingPiece = "random_erase";  // its name in the registry
struct RandomErasingOptions {
  double p = 0.0;                                // data.random_erase (0 = off)
  std::vector<double> scale = {0.02, 0.33};      // data.random_erase_scale
  std::vector<double> ratio = {0.3, 3.3};        // data.random_erase_ratio
  std::vector<double> value = {0.0};             // data.random_erase_value, in normalised units
};
inline void declare_settings(ConfigSchema& s, RandomErasingOptions& o) {
  s.add("data", "random_erase", &o.p,
        "probability of torchvision's RandomErasing per training sample, after normalisation (0 = off)")
      .min(0)
      .max(1);
  s.add("data", "random_erase_scale", &o.scale, "random erasing: range of the erased area fraction");
  s.add("data", "random_erase_ratio", &o.ratio, "random erasing: range of the aspect ratio");
  s.add("data", "random_erase_value", &o.value,
        "random erasing: the erased value(s) in normalised units, one or one per channel (0 = the mean colour)");
}

inline constexpr const char* kMixUpCutMixPiece = "mixup_cutmix";
struct MixUpCutMixOptions {
  double mixup_alpha = 0.0;   // data.mixup_alpha (0 = off)
  double cutmix_alpha = 0.0;  // data.cutmix_alpha (0 = off); with both, one of the two per batch
};
inline void declare_settings(ConfigSchema& s, MixUpCutMixOptions& o) {
  s.add("data", "mixup_alpha", &o.mixup_alpha,
        "MixUp on the device, λ ~ Beta(α, α), soft targets (0 = off; with cutmix_alpha, one of the two per batch)")
      .non_negative();
  s.add("data", "cutmix_alpha", &o.cutmix_alpha,
        "CutMix on the device, λ ~ Beta(α, α), λ corrected to the box (0 = off)")
      .non_negative();
}

// The draws (CutMixBox, cutmix_box, MixDraw, draw_mix, EraseBox, draw_erase) are the data layer's
// (data/batch_draws.h), so that the data commands and the Python module reach them too.
using data::CutMixBox;
using data::cutmix_box;
using data::draw_erase;
using data::draw_mix;
using data::EraseBox;
using data::MixDraw;

// The batch transforms themselves (the registry's factories in recipe.cpp check the job's keys and
// call these). MixUp/CutMix turn the targets into [B, classes] float soft targets.
class BatchTransform;
std::unique_ptr<BatchTransform> mixup_cutmix_transform(uint64_t seed, double mixup_alpha, double cutmix_alpha,
                                                       int64_t classes);
std::unique_ptr<BatchTransform> random_erasing_transform(uint64_t seed, double p, std::vector<double> scale,
                                                         std::vector<double> ratio, std::vector<double> value);

}  // namespace crucible::train
