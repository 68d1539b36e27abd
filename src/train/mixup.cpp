// MixUp/CutMix and random erasing as batch transforms (see mixup.h), following
// torchvision/transforms/v2/_augment.py: MixUp, CutMix (their _mixup_label) and RandomErasing.
// Their draws are the data layer's (data/transforms/batch_draws.h).
#include "crucible/train/mixup.h"

#include <ATen/ATen.h>

#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/samplers/sampler.h"
#include "crucible/train/job.h"
#include "crucible/train/recipe.h"

namespace crucible::train {

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
  const auto d = job.config.data.pieces.get<MixUpCutMixOptions>(kMixUpCutMixPiece);
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
  const auto d = job.config.data.pieces.get<RandomErasingOptions>(kRandomErasingPiece);
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
