// Per-sample transforms on uint8 pixels, run on the loader threads after the crop and resize,
// in a fixed order, each drawing what it needs from the sample's own RNG stream (law 1), so a
// sample's pixels never depend on which thread made it. The chain a job runs is built from the
// registry in train/recipe.cpp; the random horizontal flip is the first entry. Torch-free;
// transforms are immutable once built and thread-safe to apply.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/core/rng.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

struct ImageSpec;

// One sample's pixels, written in place: [height, width, channels] (interleaved), or
// [channels, height, width] when `planar` (a channels-first batch's slot).
struct ImageRef {
  uint8_t* pixels = nullptr;
  int width = 0, height = 0, channels = 0;
  bool planar = false;
};

class SampleTransform {
 public:
  virtual ~SampleTransform() = default;
  // Transforms `image` in place, drawing from `rng` (the sample's stream, after the crop's draws).
  virtual void apply(ImageRef image, SampleRng& rng) const = 0;
  // A transform that only mirrors the image may be folded into the resize that writes it: it
  // makes the draws apply() would make and returns whether to mirror; the pipeline then writes
  // the mirrored pixels itself (the same bytes as apply() after the resize, one pass less).
  // Returns false when it cannot be folded (the default); `mirror` is then untouched.
  virtual bool fold_mirror(SampleRng& rng, bool* mirror) const { return false; }
  // One short phrase for the pipeline's log line ("flip p=0.5").
  virtual std::string describe() const = 0;
};

// A job's chain, applied in order.
using SampleTransforms = std::vector<std::shared_ptr<const SampleTransform>>;

// Applies transforms[first..] to `image` in order.
void apply_transforms(const SampleTransforms& transforms, size_t first, ImageRef image, SampleRng& rng);
// The chain's phrases joined by ", " ("" when empty).
std::string describe_transforms(const SampleTransforms& transforms);

// torchvision's RandomHorizontalFlip(p): mirrors the image with probability p (one uniform draw).
// Its setting, data.hflip, is declared here (RandomHorizontalFlipOptions); the recipe's registry
// (train/data_recipe.cpp) places it first after the crop, as torchvision's preset does.
class RandomHorizontalFlip final : public SampleTransform {
 public:
  explicit RandomHorizontalFlip(float p);  // bad_input unless 0 <= p <= 1
  void apply(ImageRef image, SampleRng& rng) const override;
  bool fold_mirror(SampleRng& rng, bool* mirror) const override;
  std::string describe() const override;
  float p() const { return p_; }

 private:
  float p_;
};

struct RandomHorizontalFlipOptions {
  double p = 0.5;  // data.hflip
};
void declare_settings(ConfigSchema& schema, RandomHorizontalFlipOptions& options);
// The flip for a training pipeline of `spec`, or null when p = 0 or the samples are float
// features (used as they are; the log says so).
std::shared_ptr<const SampleTransform> make_random_horizontal_flip(const RandomHorizontalFlipOptions& options,
                                                                   const ImageSpec& spec);

}  // namespace crucible::data
