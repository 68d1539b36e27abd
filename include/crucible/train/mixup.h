// MixUp and CutMix (data.mixup_alpha, data.cutmix_alpha) and random erasing (data.random_erase) as
// batch transforms, equal to torchvision.transforms.v2's MixUp/CutMix (chosen per batch by
// RandomChoice when both are set, as references/classification/train.py does) and RandomErasing.
// The draws are pure functions declared here (torch-free): MixUp/CutMix of (seed, step, rank),
// erasing of (seed, epoch, sample index) — a resumed or rerun step draws what it drew before.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "crucible/core/config.h"

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

// v2.CutMix.make_params given λ and the centre (rx, ry) of a width × height image: half sides
// int(0.5·sqrt(1 - λ)·W) and ·H, clamped to the image; λ corrected to the box's area.
struct CutMixBox {
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  int64_t rx = 0, ry = 0;     // the centre drawn
  double lam_adjusted = 1.0;  // 1 - box area / image area
};
CutMixBox cutmix_box(double lam, int64_t rx, int64_t ry, int64_t width, int64_t height);

// One batch's mixing: which (none when neither alpha is set), λ ~ Beta(α, α), and CutMix's box.
struct MixDraw {
  enum class Kind { kNone, kMixUp, kCutMix };
  Kind kind = Kind::kNone;
  double lam = 1.0;        // the images' weight (MixUp), or the corrected weight (CutMix)
  double lam_drawn = 1.0;  // λ as drawn from Beta(α, α) (before CutMix's correction)
  CutMixBox box;     // CutMix only
};
MixDraw draw_mix(uint64_t seed, int64_t step, int64_t rank, double mixup_alpha, double cutmix_alpha, int64_t width,
                 int64_t height);

// v2.RandomErasing.get_params for one sample of a channels × height × width image: with
// probability p, ten tries at an area in `scale` of the image and a log-uniform aspect ratio in
// `ratio`; the first that fits gives the rectangle (top, left, h, w). `erase` false: left alone
// (not drawn, or no try fit — torchvision then returns the image itself).
struct EraseBox {
  bool erase = false;
  int64_t top = 0, left = 0, h = 0, w = 0;
  // The draws as torchvision makes them, to hand it the same ones: torch.rand(1) against p, then
  // per try the area share (uniform in scale) and the log aspect ratio (uniform in log ratio),
  // both float32; top and left are its two torch.randint.
  float apply_draw = 0;
  int tries = 0;
  std::array<std::pair<float, float>, 10> tried{};  // (area share, log ratio) of each try
};
EraseBox draw_erase(uint64_t seed, int64_t epoch, int64_t sample, double p, double scale_min, double scale_max,
                    double ratio_min, double ratio_max, int64_t width, int64_t height);

// The batch transforms themselves (the registry's factories in recipe.cpp check the job's keys and
// call these). MixUp/CutMix turn the targets into [B, classes] float soft targets.
class BatchTransform;
std::unique_ptr<BatchTransform> mixup_cutmix_transform(uint64_t seed, double mixup_alpha, double cutmix_alpha,
                                                       int64_t classes);
std::unique_ptr<BatchTransform> random_erasing_transform(uint64_t seed, double p, std::vector<double> scale,
                                                         std::vector<double> ratio, std::vector<double> value);

}  // namespace crucible::train
