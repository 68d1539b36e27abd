// torchvision's classification reference schedules, "step", "cosine" and "exponential"
// (references/classification/train.py): the main scheduler after an optional LinearLR/
// ConstantLR warm-up, chained by SequentialLR. The replay follows torch's chainable get_lr
// (each lr from the one before, as torch computes it, operation for operation), from anchors
// kept every kAnchorEvery scheduler steps. With their keys of [schedule].
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/train/schedule.h"

namespace crucible::train {
namespace {

constexpr int64_t kAnchorEvery = 64;

// Python's a % b for b > 0 (never negative).
int64_t floor_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

// The checks of the chain's keys, each error naming the key, what it expects and what it found.
void check_torchvision(const ScheduleOptions& o, int64_t total, int64_t per_epoch) {
  if (per_epoch < 1 || total % per_epoch != 0) {
    throw bad_input("schedule.name = \"{}\" counts epochs: it needs the optimizer steps per epoch, a divisor of the "
                    "{} steps (given {})", o.name, total, per_epoch);
  }
  if (o.interval != "epoch" && o.interval != "step") {
    throw bad_input("schedule.interval: expected \"epoch\" or \"step\", found \"{}\"", o.interval);
  }
  const int64_t epochs = total / per_epoch;
  if (o.warmup_epochs < 0) {
    throw bad_input("schedule.warmup_epochs: expected an integer ≥ 0, found {}", o.warmup_epochs);
  }
  if (o.warmup_epochs >= epochs) {
    throw bad_input("schedule.warmup_epochs = {} leaves schedule.name = \"{}\" no epoch after the warm-up: expected "
                    "fewer than train.epochs = {}", o.warmup_epochs, o.name, epochs);
  }
  if (o.warmup_method != "linear" && o.warmup_method != "constant") {
    throw bad_input("schedule.warmup_method: expected \"linear\" or \"constant\", found \"{}\"", o.warmup_method);
  }
  if (!(o.warmup_decay > 0.0 && o.warmup_decay <= 1.0)) {
    throw bad_input("schedule.warmup_decay: expected a factor in (0, 1] (the warm-up starts at lr × warmup_decay), "
                    "found {}", o.warmup_decay);
  }
  if (o.name == "step" && o.step_size < 1) {
    throw bad_input("schedule.step_size: expected an integer ≥ 1 ({}s between decays), found {}", o.interval,
                    o.step_size);
  }
  if (o.name != "cosine" && !(o.gamma > 0.0 && std::isfinite(o.gamma))) {
    throw bad_input("schedule.gamma: expected a factor > 0, found {}", o.gamma);
  }
  if (o.name == "cosine" && !(o.lr_min >= 0.0 && std::isfinite(o.lr_min))) {
    throw bad_input("schedule.lr_min: expected a learning rate ≥ 0, found {}", o.lr_min);
  }
}

class TorchvisionChain final : public ScheduleCurve {
 public:
  explicit TorchvisionChain(const ScheduleBuild& b)
      : opt_(b.options), peak_(b.peak_lr), momentum_(b.momentum), total_(b.total_steps), per_epoch_(b.steps_per_epoch) {
    check_torchvision(opt_, total_, per_epoch_);
    per_tick_ = opt_.interval == "epoch" ? per_epoch_ : 1;
    warm_ = opt_.warmup_epochs * (per_epoch_ / per_tick_);
    const int64_t ticks = total_ / per_tick_;
    t_max_ = ticks - warm_;  // train.py: T_max = epochs - warmup_epochs
    double lr = chain_at(0);
    for (int64_t n = 0; n < ticks; ++n) {
      if (n > 0) lr = chain_next(lr, n);
      if (n % kAnchorEvery == 0) anchor_.push_back(lr);
    }
  }

  SchedulePoint at(int64_t step) const override {
    return {chain_at(std::clamp<int64_t>(step, 0, total_ - 1) / per_tick_), momentum_};
  }

  std::string describe() const override {
    const std::string unit = opt_.interval == "epoch" ? "epoch" : "step";
    const auto count = [&](int64_t n) { return fmt::format("{} {}{}", n, unit, n == 1 ? "" : "s"); };
    std::string main;
    if (opt_.name == "step") main = fmt::format("lr {} × {} every {}", peak_, opt_.gamma, count(opt_.step_size));
    if (opt_.name == "exponential") main = fmt::format("lr {} × {} per {}", peak_, opt_.gamma, unit);
    if (opt_.name == "cosine") {
      main = fmt::format("cosine from lr {} to {} over {}", peak_, opt_.lr_min, count(t_max_));
    }
    const std::string warm =
        warm_ == 0 ? ""
                   : fmt::format("{} warm-up from lr × {} over {}, then ", opt_.warmup_method, opt_.warmup_decay,
                                 count(warm_));
    return fmt::format("{} (torchvision's reference, lr set every {}): {}{}", opt_.name, unit, warm, main);
  }

 private:
  // The lr train.py's scheduler gives after n calls of step(): the warm-up scheduler (LinearLR
  // or ConstantLR, total_iters = warm_) before the milestone, the main one from it on.
  double chain_at(int64_t n) const {
    if (n == 0) {
      // The warm-up's first step (lr × start_factor, or × factor); without one, the main
      // scheduler's first step leaves the lr as it is.
      return warm_ > 0 ? peak_ * opt_.warmup_decay : peak_;
    }
    const int64_t k = std::min<int64_t>(n / kAnchorEvery, static_cast<int64_t>(anchor_.size()) - 1);
    double lr = anchor_[k];
    for (int64_t i = k * kAnchorEvery + 1; i <= n; ++i) lr = chain_next(lr, i);
    return lr;
  }

  // `lr` is the value after n - 1 steps (n ≥ 1). Written in torch's order of operations, so the
  // replay rounds as torch does; std::cos is the libm math.cos calls.
  double chain_next(double lr, int64_t n) const {
    const double eta = opt_.lr_min;
    if (n < warm_) {
      if (opt_.warmup_method == "constant") return lr;  // ConstantLR: unchanged until total_iters
      // LinearLR.get_lr, end_factor 1.
      const double s = opt_.warmup_decay;
      return lr * (1.0 + (1.0 - s) / (static_cast<double>(warm_) * s + static_cast<double>(n - 1) * (1.0 - s)));
    }
    if (n == warm_) {
      // SequentialLR at its milestone steps the main scheduler with epoch 0, which takes its
      // closed form: base × gamma^0 for step and exponential, and for cosine the sum below
      // (which may differ from the base lr in its last bit).
      if (opt_.name != "cosine") return peak_;
      return eta + (peak_ - eta) * (1.0 + std::cos(0.0)) / 2.0;
    }
    const int64_t m = n - warm_;  // the main scheduler's last_epoch
    if (opt_.name == "step") return m % opt_.step_size == 0 ? lr * opt_.gamma : lr;
    if (opt_.name == "exponential") return lr * opt_.gamma;
    // CosineAnnealingLR.get_lr, the chainable form.
    const double t = static_cast<double>(t_max_);
    if (floor_mod(m - 1 - t_max_, 2 * t_max_) == 0) return lr + (peak_ - eta) * (1.0 - std::cos(M_PI / t)) / 2.0;
    return (1.0 + std::cos(M_PI * static_cast<double>(m) / t)) /
               (1.0 + std::cos(M_PI * static_cast<double>(m - 1) / t)) * (lr - eta) +
           eta;
  }

  ScheduleOptions opt_;
  double peak_;
  double momentum_;
  int64_t total_;
  int64_t per_epoch_ = 0;       // optimizer steps per epoch (0: not given)
  int64_t per_tick_ = 1;        // optimizer steps per scheduler step: per_epoch_ or 1 (interval "step")
  int64_t warm_ = 0;            // warm-up scheduler steps (SequentialLR's milestone)
  int64_t t_max_ = 0;           // cosine: scheduler steps after the warm-up
  std::vector<double> anchor_;  // chain_at(k × kAnchorEvery), so at() replays at most kAnchorEvery - 1 steps
};

// The chain's keys (declared by the first of its schedules registered).
void declare_chain(ScheduleOptions& o, ConfigSchema& s) {
  if (s.find("schedule", "interval") != nullptr) return;
  s.add("schedule", "interval", &o.interval,
        "step/cosine/exponential: \"epoch\" = the lr changes at epoch boundaries (torchvision's train.py steps its "
        "scheduler once per epoch); \"step\" = the same chain counted in optimizer steps (warm-up, T_max, "
        "step_size in steps)")
      .choices({"epoch", "step"});
  s.add("schedule", "warmup_epochs", &o.warmup_epochs,
        "step/cosine/exponential (--lr-warmup-epochs): epochs of warm-up before the main schedule, fewer than "
        "train.epochs (0 = none); interval = \"step\": warmup_epochs × steps per epoch steps")
      .non_negative();
  s.add("schedule", "warmup_method", &o.warmup_method,
        "--lr-warmup-method: linear (LinearLR: lr × warmup_decay rising to lr) or constant (ConstantLR: lr × "
        "warmup_decay throughout)")
      .choices({"linear", "constant"});
  s.add("schedule", "warmup_decay", &o.warmup_decay, "--lr-warmup-decay: the warm-up starts at lr × warmup_decay")
      .positive()
      .max(1);
  s.add("schedule", "step_size", &o.step_size,
        "step (--lr-step-size): lr × gamma every step_size epochs (interval = \"step\": optimizer steps)")
      .min(1);
  s.add("schedule", "gamma", &o.gamma,
        "step/exponential/multistep (--lr-gamma): the factor per step_size epochs (step), per epoch (exponential; per "
        "optimizer step with interval = \"step\") or at each milestone (multistep)")
      .positive();
  s.add("schedule", "lr_min", &o.lr_min, "cosine (--lr-min): eta_min, reached at T_max = epochs - warmup_epochs")
      .non_negative();
}

std::unique_ptr<const ScheduleCurve> make_chain(const ScheduleBuild& b) { return std::make_unique<TorchvisionChain>(b); }

}  // namespace

ScheduleKind torchvision_chain_schedule() { return {declare_chain, make_chain}; }

}  // namespace crucible::train
