// The draws of the batch transforms MixUp/CutMix and random erasing (train/mixup.h applies them):
// pure, torch-free functions of (seed, step, rank) or (seed, epoch, sample), the same for a rerun or
// resumed step. In the data layer so that the Python module shows them to the tests that compare
// their laws with torchvision's own samplers (tests/python/test_distributions.py).
#pragma once

#include <array>
#include <cstdint>
#include <utility>

namespace crucible::data {

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

}  // namespace crucible::data
