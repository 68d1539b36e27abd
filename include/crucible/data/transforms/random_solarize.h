// torchvision's RandomSolarize(threshold, p) as a sample transform: with probability p (one
// uniform draw from the sample's stream), every value >= threshold becomes 255 - value
// (transforms.v2.functional.solarize on uint8). Its settings, data.solarize and
// data.solarize_threshold, are declared here; the recipe's registry (train/data_recipe.cpp)
// places it after the automatic augmentation, as DINO's and BYOL's recipes solarize last.
// Torch-free; immutable and thread-safe once built.
#pragma once

#include <memory>
#include <string>

#include "crucible/data/transforms/sample_transform.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

struct ImageSpec;

struct RandomSolarizeOptions {
  double p = 0;            // data.solarize: the probability per training sample (0 = off)
  double threshold = 128;  // data.solarize_threshold: in pixel levels, 0–255
};
void declare_settings(ConfigSchema& schema, RandomSolarizeOptions& options);

class RandomSolarize final : public SampleTransform {
 public:
  explicit RandomSolarize(const RandomSolarizeOptions& options);  // bad_input out of range
  void apply(ImageRef image, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  RandomSolarizeOptions o_;
};

// The transform for a training pipeline of `spec`, or null when p = 0 (bad_input for float
// features, which have no pixel levels to invert).
std::shared_ptr<const SampleTransform> make_random_solarize(const RandomSolarizeOptions& options, const ImageSpec& spec);

}  // namespace crucible::data
