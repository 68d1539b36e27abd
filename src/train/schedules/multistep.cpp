// torchvision's detection reference schedule, "multistep": references/detection/train.py builds
// MultiStepLR(milestones=--lr-steps, gamma=--lr-gamma) and steps it once per epoch; in the
// first epoch engine.py's train_one_epoch adds LinearLR(start_factor=1/1000, total_iters=
// min(1000, len(data_loader) - 1)) stepped after every iteration. Both are chainable (each lr
// from the one before), so the replay below follows torch's operations: the first epoch's
// lrs one by one, then one value per epoch.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/train/schedule.h"

namespace crucible::train {
namespace {

class MultiStep final : public ScheduleCurve {
 public:
  explicit MultiStep(const ScheduleBuild& b)
      : o_(b.options), peak_(b.peak_lr), momentum_(b.momentum), total_(b.total_steps), per_epoch_(b.steps_per_epoch) {
    if (per_epoch_ < 1 || total_ % per_epoch_ != 0) {
      throw bad_input("schedule.name = \"multistep\" counts epochs: it needs the optimizer steps per epoch, a divisor "
                      "of the {} steps (given {})", total_, per_epoch_);
    }
    if (!(o_.gamma > 0.0 && std::isfinite(o_.gamma))) {
      throw bad_input("schedule.gamma: expected a factor > 0, found {}", o_.gamma);
    }
    if (o_.warmup_iters < 0) throw bad_input("schedule.warmup_iters: expected an integer ≥ 0, found {}", o_.warmup_iters);
    if (!(o_.warmup_factor > 0.0 && o_.warmup_factor <= 1.0)) {
      throw bad_input("schedule.warmup_factor: expected a factor in (0, 1], found {}", o_.warmup_factor);
    }
    std::map<int64_t, int> count;  // MultiStepLR's Counter(milestones)
    for (double m : o_.milestones) {
      if (!(m >= 1 && std::floor(m) == m)) {
        throw bad_input("schedule.milestones: expected epochs (integers ≥ 1), found {}", m);
      }
      ++count[static_cast<int64_t>(m)];
    }
    // The first epoch: LinearLR's initial step multiplies the lr by warmup_factor, each of its
    // steps up to total_iters by its chainable factor; MultiStepLR's initial step left lr as is.
    double lr = peak_;
    const int64_t t = std::min(o_.warmup_iters, per_epoch_ - 1);
    const double s = o_.warmup_factor;
    if (o_.warmup_iters > 0) lr = lr * s;
    for (int64_t n = 1; n <= per_epoch_; ++n) {
      first_epoch_.push_back(lr);
      if (o_.warmup_iters > 0 && n <= t) {
        lr = lr * (1.0 + (1.0 - s) / (static_cast<double>(t) * s + static_cast<double>(n - 1) * (1.0 - s)));
      }
    }
    // Each epoch end: MultiStepLR.step() → lr × gamma ** count at a milestone.
    const int64_t epochs = total_ / per_epoch_;
    for (int64_t e = 1; e < epochs; ++e) {
      const auto it = count.find(e);
      if (it != count.end()) lr = lr * std::pow(o_.gamma, static_cast<double>(it->second));
      epoch_lr_.push_back(lr);
    }
  }

  SchedulePoint at(int64_t step) const override {
    const int64_t k = std::clamp<int64_t>(step, 0, total_ - 1);
    const int64_t e = k / per_epoch_;
    return {e == 0 ? first_epoch_[static_cast<size_t>(k)] : epoch_lr_[static_cast<size_t>(e - 1)], momentum_};
  }

  std::string describe() const override {
    const std::string warm =
        o_.warmup_iters > 0
            ? fmt::format("linear warm-up from lr × {} over {} steps, then ", o_.warmup_factor,
                          std::min(o_.warmup_iters, per_epoch_ - 1))
            : "";
    return fmt::format("multistep (torchvision's detection reference, lr set every epoch): {}lr {} × {} after epochs "
                       "[{}]", warm, peak_, o_.gamma, fmt::join(o_.milestones, ", "));
  }

 private:
  ScheduleOptions o_;
  double peak_, momentum_;
  int64_t total_, per_epoch_;
  std::vector<double> first_epoch_;  // the lr of each step of epoch 0
  std::vector<double> epoch_lr_;     // the lr of epochs 1, 2, …
};

void declare_multistep(ScheduleOptions& o, ConfigSchema& s) {
  s.add("schedule", "milestones", &o.milestones,
        "multistep (--lr-steps): the epochs after which the lr is multiplied by schedule.gamma (torchvision's "
        "detection reference: [16, 22] of 26)")
      .min(1);
  s.add("schedule", "warmup_iters", &o.warmup_iters,
        "multistep: a linear warm-up over the first epoch's first min(warmup_iters, steps per epoch - 1) steps, as "
        "torchvision's detection engine.py (0 = none)")
      .non_negative();
  s.add("schedule", "warmup_factor", &o.warmup_factor, "multistep: the warm-up's first lr = lr × warmup_factor")
      .positive()
      .max(1);
}

}  // namespace

ScheduleKind multistep_schedule() {
  return {declare_multistep, [](const ScheduleBuild& b) -> std::unique_ptr<const ScheduleCurve> {
            return std::make_unique<MultiStep>(b);
          }};
}

}  // namespace crucible::train
