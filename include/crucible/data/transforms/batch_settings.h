// The settings of the batch transforms training runs on the device after the loader — random
// erasing and MixUp/CutMix (train/mixup.h applies them, data/transforms/batch_draws.h draws them). Their keys
// sit in [data], and the data layer owns [data]: bind_data_config binds them into
// DataConfig::pieces, so that every command reading [data] accepts them, and the data commands,
// which cannot apply them, say so (data_settings.h). Torch-free.
#pragma once

#include <vector>

#include "crucible/core/config.h"
#include "crucible/data/data_config.h"

namespace crucible::data {

inline constexpr const char* kRandomErasingPiece = "random_erase";  // its name in train/recipe.cpp's registry
struct RandomErasingOptions {
  double p = 0.0;                            // data.random_erase (0 = off)
  std::vector<double> scale = {0.02, 0.33};  // data.random_erase_scale
  std::vector<double> ratio = {0.3, 3.3};    // data.random_erase_ratio
  std::vector<double> value = {0.0};         // data.random_erase_value, in normalised units
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

inline constexpr const char* kMixUpCutMixPiece = "mixup_cutmix";  // its name in train/recipe.cpp's registry
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

// Binds both pieces' keys to their options in config.pieces (bind_data_config calls it, last).
void declare_batch_transform_settings(DataConfig& config, ConfigSchema& schema);

}  // namespace crucible::data
