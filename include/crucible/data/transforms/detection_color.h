// The detection presets' colour transforms: torchvision.transforms.v2's RandomPhotometricDistort
// (SSD's photometric distortions), which changes the pixels and leaves the boxes as they are.
// Its draws and its operations are those of v2 (tests/python/test_detection_color.py holds both
// to torchvision). Torch-free.
#pragma once

#include <array>
#include <string>

#include "crucible/data/transforms/detection.h"

namespace crucible::data {

// RandomPhotometricDistort's arguments, with torchvision's defaults: a factor range for each
// jitter and the probability `p` of each jitter and of the channel permutation.
struct PhotometricDistortOptions {
  std::array<double, 2> brightness{0.875, 1.125};
  std::array<double, 2> contrast{0.5, 1.5};
  std::array<double, 2> saturation{0.5, 1.5};
  std::array<double, 2> hue{-0.05, 0.05};
  double p = 0.5;
};

namespace detection {

// The options from a detection op's settings (keys brightness, contrast, saturation, hue: [min,
// max]; p): a key not given keeps torchvision's default. bad_input naming a setting out of range.
PhotometricDistortOptions photometric_distort_options(const DetectionParams& settings);

// make_params for an image of `channels` channels, drawn in torchvision's order: for each of
// brightness, contrast, saturation, hue a coin with p and, on heads, its factor uniform in the
// range; contrast_before (a fair coin); a coin with p for the channel permutation and, on heads,
// a uniform permutation. A jitter not applied, or no permutation, is an empty list (v2's None).
// Keys: brightness_factor, contrast_factor, saturation_factor, hue_factor, contrast_before (0/1),
// channel_permutation.
DetectionParams draw_photometric_distort(const PhotometricDistortOptions& options, int channels, SampleRng& rng);

// transform(image, params): brightness; contrast when contrast_before; saturation; hue; contrast
// when not contrast_before; the channel permutation (output channel c = input channel perm[c]).
// Boxes are untouched.
void photometric_distort(DetectionImage& s, const DetectionParams& params);

}  // namespace detection

class RandomPhotometricDistort final : public DetectionTransform {
 public:
  explicit RandomPhotometricDistort(PhotometricDistortOptions options = {});
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  PhotometricDistortOptions options_;
};

}  // namespace crucible::data
