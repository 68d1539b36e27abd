// Schedule formulas; onecycle follows torch/optim/lr_scheduler.py OneCycleLR.get_lr. The
// torchvision schedules replay torch's chainable get_lr (each lr from the one before, as torch
// computes it, operation for operation), from anchors kept every kAnchorEvery scheduler steps.
#include "crucible/train/schedule.h"

#include "crucible/core/rng.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::train {
namespace {

double cos_anneal(double start, double end, double pct) { return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0); }

constexpr int64_t kAnchorEvery = 64;

// Python's a % b for b > 0 (never negative).
int64_t floor_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

// The checks of the torchvision schedules' keys, each error naming the key, what it expects and
// what it found.
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

}  // namespace

Schedule::Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps,
                   int64_t steps_per_epoch)
    : opt_(options), peak_(peak_lr), momentum_(momentum), total_(total_steps), per_epoch_(steps_per_epoch) {
  if (total_ < 1) throw bad_input("schedule: training has {} steps; at least 1 is needed", total_);
  if (opt_.name != "onecycle" && opt_.name != "warmup_cosine" && opt_.name != "constant" && !torchvision()) {
    throw bad_input("schedule.name: unknown schedule \"{}\" (known: onecycle, warmup_cosine, constant, step, cosine, "
                    "exponential)", opt_.name);
  }
  if (opt_.name == "onecycle" && opt_.warmup * static_cast<double>(total_) - 1.0 <= 0.0) {
    throw bad_input("schedule.warmup = {} leaves onecycle no rising phase over {} steps: raise it or train longer",
                    opt_.warmup, total_);
  }
  if (!torchvision()) return;
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

bool Schedule::torchvision() const {
  return opt_.name == "step" || opt_.name == "cosine" || opt_.name == "exponential";
}

// The lr train.py's scheduler gives after n calls of step(): the warm-up scheduler (LinearLR or
// ConstantLR, total_iters = warm_) before the milestone, the main one from it on.
double Schedule::chain_at(int64_t n) const {
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
double Schedule::chain_next(double lr, int64_t n) const {
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
  return (1.0 + std::cos(M_PI * static_cast<double>(m) / t)) / (1.0 + std::cos(M_PI * static_cast<double>(m - 1) / t)) *
             (lr - eta) +
         eta;
}

Schedule::Point Schedule::at(int64_t step) const {
  if (torchvision()) return {chain_at(std::clamp<int64_t>(step, 0, total_ - 1) / per_tick_), momentum_};
  const double s = static_cast<double>(std::clamp<int64_t>(step, 0, total_ - 1));
  const double first = peak_ / opt_.div_factor;
  const double last = first / opt_.final_div_factor;
  if (opt_.name == "constant") return {peak_, momentum_};
  if (opt_.name == "onecycle") {
    // Phase ends as OneCycleLR computes them: float(pct_start * total) - 1, then total - 1.
    const double end1 = opt_.warmup * static_cast<double>(total_) - 1.0;
    const double end2 = static_cast<double>(total_) - 1.0;
    const bool cyc = opt_.cycle_momentum;
    if (s <= end1) {
      const double pct = s / end1;
      return {cos_anneal(first, peak_, pct), cyc ? cos_anneal(opt_.max_momentum, opt_.base_momentum, pct) : momentum_};
    }
    const double pct = (s - end1) / (end2 - end1);
    return {cos_anneal(peak_, last, pct), cyc ? cos_anneal(opt_.base_momentum, opt_.max_momentum, pct) : momentum_};
  }
  // warmup_cosine: linear from `first` to the peak over the warm-up, cosine down to `last`.
  const double warm = std::floor(opt_.warmup * static_cast<double>(total_));
  if (s < warm) return {first + (peak_ - first) * s / warm, momentum_};
  const double span = std::max(1.0, static_cast<double>(total_ - 1) - warm);
  return {cos_anneal(peak_, last, std::min(1.0, (s - warm) / span)), momentum_};
}

std::string Schedule::describe() const {
  if (opt_.name == "constant") return fmt::format("constant lr {}", peak_);
  if (torchvision()) {
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
  std::string m = opt_.name == "onecycle" && opt_.cycle_momentum
                      ? fmt::format(", momentum {}→{}→{}", opt_.max_momentum, opt_.base_momentum, opt_.max_momentum)
                      : "";
  return fmt::format("{} over {} steps: lr {:.3g} → {:.3g} (at {:.0f}%) → {:.3g}{}", opt_.name, total_,
                     peak_ / opt_.div_factor, peak_, 100 * opt_.warmup, peak_ / opt_.div_factor / opt_.final_div_factor, m);
}

int64_t multi_scale_size(uint64_t seed, int64_t step, const std::vector<int64_t>& sizes) {
  SampleRng rng(derive_seed(seed, RngStream::kScale), static_cast<uint64_t>(step), 0);
  return sizes[rng.next_u32() % static_cast<uint32_t>(sizes.size())];
}

}  // namespace crucible::train
