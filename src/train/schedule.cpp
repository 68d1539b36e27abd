// Schedule formulas; onecycle follows torch/optim/lr_scheduler.py OneCycleLR.get_lr.
#include "crucible/train/schedule.h"

#include "crucible/core/rng.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::train {
namespace {

double cos_anneal(double start, double end, double pct) { return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0); }

}  // namespace

Schedule::Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps)
    : opt_(options), peak_(peak_lr), momentum_(momentum), total_(total_steps) {
  if (total_ < 1) throw bad_input("schedule: training has {} steps; at least 1 is needed", total_);
  if (opt_.name != "onecycle" && opt_.name != "warmup_cosine" && opt_.name != "constant") {
    throw bad_input("schedule.name: unknown schedule \"{}\" (known: onecycle, warmup_cosine, constant)", opt_.name);
  }
  if (opt_.name == "onecycle" && opt_.warmup * static_cast<double>(total_) - 1.0 <= 0.0) {
    throw bad_input("schedule.warmup = {} leaves onecycle no rising phase over {} steps: raise it or train longer",
                    opt_.warmup, total_);
  }
}

Schedule::Point Schedule::at(int64_t step) const {
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
