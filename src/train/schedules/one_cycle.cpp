// The schedules counted in steps with a rising phase: "onecycle" (torch/optim/lr_scheduler.py
// OneCycleLR.get_lr), "warmup_cosine" and "constant", with their keys of [schedule].
#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/train/schedule.h"

namespace crucible::train {
namespace {

double cos_anneal(double start, double end, double pct) { return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0); }

class OneCycle final : public ScheduleCurve {
 public:
  explicit OneCycle(const ScheduleBuild& b) : o_(b.options), peak_(b.peak_lr), momentum_(b.momentum), total_(b.total_steps) {
    if (o_.warmup * static_cast<double>(total_) - 1.0 <= 0.0) {
      throw bad_input("schedule.warmup = {} leaves onecycle no rising phase over {} steps: raise it or train longer",
                      o_.warmup, total_);
    }
  }

  SchedulePoint at(int64_t step) const override {
    const double s = static_cast<double>(std::clamp<int64_t>(step, 0, total_ - 1));
    const double first = peak_ / o_.div_factor;
    const double last = first / o_.final_div_factor;
    // Phase ends as OneCycleLR computes them: float(pct_start * total) - 1, then total - 1.
    const double end1 = o_.warmup * static_cast<double>(total_) - 1.0;
    const double end2 = static_cast<double>(total_) - 1.0;
    const bool cyc = o_.cycle_momentum;
    if (s <= end1) {
      const double pct = s / end1;
      return {cos_anneal(first, peak_, pct), cyc ? cos_anneal(o_.max_momentum, o_.base_momentum, pct) : momentum_};
    }
    const double pct = (s - end1) / (end2 - end1);
    return {cos_anneal(peak_, last, pct), cyc ? cos_anneal(o_.base_momentum, o_.max_momentum, pct) : momentum_};
  }

  std::string describe() const override {
    const std::string m = o_.cycle_momentum ? fmt::format(", momentum {}→{}→{}", o_.max_momentum, o_.base_momentum,
                                                          o_.max_momentum)
                                            : "";
    return fmt::format("onecycle over {} steps: lr {:.3g} → {:.3g} (at {:.0f}%) → {:.3g}{}", total_,
                       peak_ / o_.div_factor, peak_, 100 * o_.warmup, peak_ / o_.div_factor / o_.final_div_factor, m);
  }

 private:
  ScheduleOptions o_;
  double peak_, momentum_;
  int64_t total_;
};

// Linear from peak / div_factor to the peak over the warm-up, then a cosine down to
// peak / div_factor / final_div_factor.
class WarmupCosine final : public ScheduleCurve {
 public:
  explicit WarmupCosine(const ScheduleBuild& b)
      : o_(b.options), peak_(b.peak_lr), momentum_(b.momentum), total_(b.total_steps) {}

  SchedulePoint at(int64_t step) const override {
    const double s = static_cast<double>(std::clamp<int64_t>(step, 0, total_ - 1));
    const double first = peak_ / o_.div_factor;
    const double last = first / o_.final_div_factor;
    const double warm = std::floor(o_.warmup * static_cast<double>(total_));
    if (s < warm) return {first + (peak_ - first) * s / warm, momentum_};
    const double span = std::max(1.0, static_cast<double>(total_ - 1) - warm);
    return {cos_anneal(peak_, last, std::min(1.0, (s - warm) / span)), momentum_};
  }

  std::string describe() const override {
    return fmt::format("warmup_cosine over {} steps: lr {:.3g} → {:.3g} (at {:.0f}%) → {:.3g}", total_,
                       peak_ / o_.div_factor, peak_, 100 * o_.warmup, peak_ / o_.div_factor / o_.final_div_factor);
  }

 private:
  ScheduleOptions o_;
  double peak_, momentum_;
  int64_t total_;
};

class Constant final : public ScheduleCurve {
 public:
  explicit Constant(const ScheduleBuild& b) : peak_(b.peak_lr), momentum_(b.momentum) {}
  SchedulePoint at(int64_t /*step*/) const override { return {peak_, momentum_}; }
  std::string describe() const override { return fmt::format("constant lr {}", peak_); }

 private:
  double peak_, momentum_;
};

// The keys of onecycle and warmup_cosine (declared by the first of them registered).
void declare_rising(ScheduleOptions& o, ConfigSchema& s) {
  if (s.find("schedule", "warmup") != nullptr) return;
  s.add("schedule", "warmup", &o.warmup, "onecycle/warmup_cosine: fraction of all steps spent rising to the peak lr")
      .min(0)
      .max(1, true);
  s.add("schedule", "div_factor", &o.div_factor, "onecycle/warmup_cosine: first lr = lr / div_factor").min(1);
  s.add("schedule", "final_div_factor", &o.final_div_factor,
        "onecycle/warmup_cosine: last lr = first lr / final_div_factor")
      .min(1);
}

}  // namespace

ScheduleKind one_cycle_schedule() {
  return {[](ScheduleOptions& o, ConfigSchema& s) {
            declare_rising(o, s);
            s.add("schedule", "cycle_momentum", &o.cycle_momentum, "onecycle: cycle momentum/beta1 inversely to lr");
            s.add("schedule", "base_momentum", &o.base_momentum, "onecycle: momentum at the peak lr").min(0).max(1, true);
            s.add("schedule", "max_momentum", &o.max_momentum, "onecycle: momentum at the ends").min(0).max(1, true);
          },
          [](const ScheduleBuild& b) -> std::unique_ptr<const ScheduleCurve> { return std::make_unique<OneCycle>(b); }};
}

ScheduleKind warmup_cosine_schedule() {
  return {declare_rising,
          [](const ScheduleBuild& b) -> std::unique_ptr<const ScheduleCurve> {
            return std::make_unique<WarmupCosine>(b);
          }};
}

ScheduleKind constant_schedule() {
  return {[](ScheduleOptions&, ConfigSchema&) {},
          [](const ScheduleBuild& b) -> std::unique_ptr<const ScheduleCurve> { return std::make_unique<Constant>(b); }};
}

}  // namespace crucible::train
