// The draws of MixUp/CutMix and random erasing (batch_draws.h), as torchvision's v2 MixUp, CutMix
// and RandomErasing make them (torchvision/transforms/v2/_augment.py).
#include "crucible/data/transforms/batch_draws.h"

#include <algorithm>
#include <cmath>

#include "crucible/core/rng.h"
#include "crucible/data/transforms/augment.h"

namespace crucible::data {

CutMixBox cutmix_box(double lam, int64_t rx, int64_t ry, int64_t width, int64_t height) {
  const double r = 0.5 * std::sqrt(1.0 - lam);
  const int64_t rw = static_cast<int64_t>(r * static_cast<double>(width));
  const int64_t rh = static_cast<int64_t>(r * static_cast<double>(height));
  CutMixBox b;
  b.rx = rx;
  b.ry = ry;
  b.x1 = std::max<int64_t>(rx - rw, 0);
  b.y1 = std::max<int64_t>(ry - rh, 0);
  b.x2 = std::min<int64_t>(rx + rw, width);
  b.y2 = std::min<int64_t>(ry + rh, height);
  b.lam_adjusted = 1.0 - static_cast<double>((b.x2 - b.x1) * (b.y2 - b.y1)) / static_cast<double>(width * height);
  return b;
}

namespace {

// Beta(α, α) as X / (X + Y) of two Gamma(α) draws (torch's Beta samples a Dirichlet the same way),
// rounded to float32 as torch's sample is.
double beta(SampleRng& rng, double alpha) {
  const double x = random_gamma(rng, alpha), y = random_gamma(rng, alpha);
  return static_cast<float>(x / (x + y));
}

}  // namespace

MixDraw draw_mix(uint64_t seed, int64_t step, int64_t rank, double mixup_alpha, double cutmix_alpha, int64_t width,
                 int64_t height) {
  MixDraw d;
  const bool mixup = mixup_alpha > 0, cutmix = cutmix_alpha > 0;
  if (!mixup && !cutmix) return d;
  SampleRng rng(derive_seed(seed, RngStream::kMix), static_cast<uint64_t>(step), static_cast<uint64_t>(rank));
  // RandomChoice([MixUp, CutMix]) draws one uniformly; with one of them there is no choice.
  bool use_cutmix = cutmix;
  if (mixup && cutmix) use_cutmix = random_index(rng, 2) == 1;
  if (!use_cutmix) {
    d.kind = MixDraw::Kind::kMixUp;
    d.lam = d.lam_drawn = beta(rng, mixup_alpha);
    return d;
  }
  d.kind = MixDraw::Kind::kCutMix;
  const double lam = d.lam_drawn = beta(rng, cutmix_alpha);
  const int64_t rx = random_index(rng, static_cast<int>(width));
  const int64_t ry = random_index(rng, static_cast<int>(height));
  d.box = cutmix_box(lam, rx, ry, width, height);
  d.lam = d.box.lam_adjusted;
  return d;
}

EraseBox draw_erase(uint64_t seed, int64_t epoch, int64_t sample, double p, double scale_min, double scale_max,
                    double ratio_min, double ratio_max, int64_t width, int64_t height) {
  EraseBox b;
  SampleRng rng(derive_seed(seed, RngStream::kErase), static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample));
  b.apply_draw = rng.uniform();
  if (!(b.apply_draw < static_cast<float>(p))) return b;
  const double area = static_cast<double>(width * height);
  // As torchvision computes them: the log ratios and the aspect in float32, Python's round (half
  // to even: nearbyint in the default rounding mode).
  const float log_lo = std::log(static_cast<float>(ratio_min)), log_hi = std::log(static_cast<float>(ratio_max));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const float share = rng.uniform(static_cast<float>(scale_min), static_cast<float>(scale_max));
    const float log_ratio = rng.uniform(log_lo, log_hi);
    b.tried[static_cast<size_t>(b.tries++)] = {share, log_ratio};
    const double erase_area = area * share;
    const double aspect = std::exp(log_ratio);
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < height && w < width)) continue;
    b.erase = true;
    b.h = h;
    b.w = w;
    b.top = random_index(rng, static_cast<int>(height - h + 1));
    b.left = random_index(rng, static_cast<int>(width - w + 1));
    return b;
  }
  return b;
}

}  // namespace crucible::data
