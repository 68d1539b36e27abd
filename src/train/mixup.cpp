// MixUp/CutMix and random erasing as batch transforms (see mixup.h), following
// torchvision/transforms/v2/_augment.py: MixUp, CutMix (their _mixup_label) and RandomErasing.
#include "crucible/train/mixup.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/rng.h"
#include "crucible/data/augment.h"
#include "crucible/data/loader.h"
#include "crucible/data/sampler.h"
#include "crucible/train/job.h"
#include "crucible/train/recipe.h"

namespace crucible::train {

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
  const double x = data::random_gamma(rng, alpha), y = data::random_gamma(rng, alpha);
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
  if (mixup && cutmix) use_cutmix = data::random_index(rng, 2) == 1;
  if (!use_cutmix) {
    d.kind = MixDraw::Kind::kMixUp;
    d.lam = d.lam_drawn = beta(rng, mixup_alpha);
    return d;
  }
  d.kind = MixDraw::Kind::kCutMix;
  const double lam = d.lam_drawn = beta(rng, cutmix_alpha);
  const int64_t rx = data::random_index(rng, static_cast<int>(width));
  const int64_t ry = data::random_index(rng, static_cast<int>(height));
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
    b.top = data::random_index(rng, static_cast<int>(height - h + 1));
    b.left = data::random_index(rng, static_cast<int>(width - w + 1));
    return b;
  }
  return b;
}

namespace {

// label.roll(1, 0).mul_(1 - λ).add_(label.mul(λ)) over one-hot (or multi-hot) targets.
at::Tensor mix_targets(const at::Tensor& targets, int64_t classes, double lam) {
  at::Tensor t = targets.dim() == 1 ? at::one_hot(targets, classes).to(at::kFloat) : targets.to(at::kFloat);
  return at::roll(t, {1}, {0}).mul_(1.0 - lam).add_(t.mul(lam));
}

class MixUpCutMix final : public BatchTransform {
 public:
  MixUpCutMix(uint64_t seed, double mixup_alpha, double cutmix_alpha, int64_t classes)
      : seed_(seed), mixup_(mixup_alpha), cutmix_(cutmix_alpha), classes_(classes) {}

  void apply(DeviceBatch& b) override {
    const at::Tensor x = b.images;
    const MixDraw d = draw_mix(seed_, b.step, b.rank, mixup_, cutmix_, x.size(3), x.size(2));
    const auto format = x.suggest_memory_format();
    if (d.kind == MixDraw::Kind::kMixUp) {
      b.images = at::roll(x, {1}, {0}).mul_(1.0 - d.lam).add_(x.mul(d.lam)).contiguous(format);
    } else {
      // out[..., y1:y2, x1:x2] = x.roll(1, 0)[..., y1:y2, x1:x2]: only the box is rolled.
      at::Tensor out = x.clone(format);
      const CutMixBox& box = d.box;
      out.slice(2, box.y1, box.y2).slice(3, box.x1, box.x2).copy_(at::roll(x.slice(2, box.y1, box.y2).slice(3, box.x1, box.x2), {1}, {0}));
      b.images = out;
    }
    b.targets = mix_targets(b.targets, classes_, d.lam);
  }

  std::string describe() const override {
    if (mixup_ > 0 && cutmix_ > 0) return fmt::format("MixUp (α {}) or CutMix (α {}), one per batch", mixup_, cutmix_);
    return mixup_ > 0 ? fmt::format("MixUp (α {})", mixup_) : fmt::format("CutMix (α {})", cutmix_);
  }

 private:
  uint64_t seed_;
  double mixup_, cutmix_;
  int64_t classes_;
};

class RandomErasing final : public BatchTransform {
 public:
  RandomErasing(uint64_t seed, double p, std::vector<double> scale, std::vector<double> ratio, std::vector<double> value)
      : seed_(seed), p_(p), scale_(std::move(scale)), ratio_(std::move(ratio)), value_(std::move(value)) {}

  void apply(DeviceBatch& b) override {
    const int64_t n = b.images.size(0), channels = b.images.size(1), h = b.images.size(2), w = b.images.size(3);
    if (static_cast<int64_t>(b.sample_ids.size()) != n) {
      throw std::logic_error(fmt::format("random erasing: {} sample ids for {} images", b.sample_ids.size(), n));
    }
    at::Tensor value;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t copy = b.copies.empty() ? 0 : b.copies[static_cast<size_t>(i)];
      const EraseBox e = draw_erase(seed_, data::draw_epoch(b.epoch, copy), b.sample_ids[static_cast<size_t>(i)], p_,
                                    scale_[0], scale_[1],
                                    ratio_[0], ratio_[1], w, h);
      if (!e.erase) continue;
      if (!value.defined()) {
        std::vector<double> v = value_.size() == 1 ? std::vector<double>(static_cast<size_t>(channels), value_[0]) : value_;
        value = at::tensor(v, at::kDouble).to(b.images.scalar_type()).to(b.images.device()).view({channels, 1, 1});
      }
      // F.erase: img[..., top:top+h, left:left+w] = v
      b.images[i].slice(1, e.top, e.top + e.h).slice(2, e.left, e.left + e.w).copy_(value.expand({channels, e.h, e.w}));
    }
  }

  std::string describe() const override {
    return fmt::format("random erasing p={} (scale {}–{}, ratio {}–{}, value {})", p_, scale_[0], scale_[1], ratio_[0],
                       ratio_[1], fmt::join(value_, ","));
  }

 private:
  uint64_t seed_;
  double p_;
  std::vector<double> scale_, ratio_, value_;
};

}  // namespace

std::unique_ptr<BatchTransform> mixup_cutmix_transform(uint64_t seed, double mixup_alpha, double cutmix_alpha,
                                                       int64_t classes) {
  return std::make_unique<MixUpCutMix>(seed, mixup_alpha, cutmix_alpha, classes);
}

std::unique_ptr<BatchTransform> random_erasing_transform(uint64_t seed, double p, std::vector<double> scale,
                                                         std::vector<double> ratio, std::vector<double> value) {
  return std::make_unique<RandomErasing>(seed, p, std::move(scale), std::move(ratio), std::move(value));
}

std::unique_ptr<BatchTransform> make_mixup_cutmix(const Job& job) {
  const auto d = job.config.pieces.get<MixUpCutMixOptions>(kMixUpCutMixPiece);
  if (d.mixup_alpha <= 0 && d.cutmix_alpha <= 0) return nullptr;
  if (job.train_loader->pipeline().output_spec().type == data::SampleType::kFeatures && d.cutmix_alpha > 0) {
    log_info("CutMix on float features: boxes are cut from the [C, H, W] feature maps");
  }
  auto t = mixup_cutmix_transform(static_cast<uint64_t>(job.config.run.seed), d.mixup_alpha, d.cutmix_alpha,
                                  job.num_classes);
  log_info("{}: soft targets from (seed, step, rank); the training accuracy counts a hit when the top prediction's "
           "share of the mixed target is over one half (the target's argmax, as torchvision's reference counts it)",
           t->describe());
  return t;
}

std::unique_ptr<BatchTransform> make_random_erasing(const Job& job) {
  const auto d = job.config.pieces.get<RandomErasingOptions>(kRandomErasingPiece);
  if (d.p <= 0) return nullptr;
  auto pair = [](const std::vector<double>& v, const char* key, bool positive) {
    if (v.size() != 2 || !(v[0] <= v[1]) || (positive && !(v[0] > 0))) {
      throw bad_input("{}: two numbers [lo, hi] with lo <= hi{} expected, found {} values", key,
                      positive ? " and lo > 0" : "", v.size());
    }
  };
  pair(d.scale, "data.random_erase_scale", false);
  pair(d.ratio, "data.random_erase_ratio", true);
  const int64_t channels = job.train_loader->pipeline().output_spec().channels;
  if (d.value.size() != 1 && static_cast<int64_t>(d.value.size()) != channels) {
    throw bad_input("data.random_erase_value: one value or one per channel ({}) expected, found {}", channels,
                    d.value.size());
  }
  return random_erasing_transform(static_cast<uint64_t>(job.config.run.seed), d.p, d.scale, d.ratio, d.value);
}

}  // namespace crucible::train
