// Learning-rate (and momentum) schedules as pure functions of the step (T8), so a resumed
// run needs only its step. Each schedule is a registry entry (schedule_registry(), one line in
// schedule.cpp) in its own file under src/train/schedules/, declaring its own keys of the
// [schedule] section and building its curve:
// - one_cycle.cpp: "onecycle" equals PyTorch's OneCycleLR (cos annealing, two phases, momentum
//   cycled between max and base); "warmup_cosine" rises linearly then follows a cosine;
//   "constant" holds the peak;
// - torchvision_chain.cpp: "step", "cosine" and "exponential" are torchvision's classification
//   reference (references/classification/train.py: StepLR, CosineAnnealingLR, ExponentialLR
//   after an optional LinearLR/ConstantLR warm-up chained by SequentialLR), equal to torch's
//   chained schedulers at every step;
// - multistep.cpp: "multistep" is torchvision's detection reference (MultiStepLR per epoch,
//   engine.py's LinearLR warm-up in the first epoch), equal to torch's at every step.
// Torch-free, immutable, thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crucible/core/registry.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::train {

struct ScheduleOptions {
  std::string name = "onecycle";
  double warmup = 0.3;             // fraction of all steps spent rising (OneCycleLR pct_start)
  double div_factor = 25.0;        // first lr = peak / div_factor
  double final_div_factor = 1e4;   // last lr = first lr / final_div_factor
  bool cycle_momentum = true;      // onecycle: momentum (AdamW beta1) from max to base and back
  double base_momentum = 0.85;
  double max_momentum = 0.95;

  // torchvision's reference ("step", "cosine", "exponential"; train.py's flag in brackets).
  // Momentum stays the optimizer's own. Counted in epochs, or with interval = "step" in
  // optimizer steps: warm-up warmup_epochs × steps_per_epoch steps, T_max and step_size in steps.
  std::string interval = "epoch";          // "epoch": the lr changes at epoch boundaries (train.py's one
                                           // scheduler.step() per epoch) | "step": every optimizer step
  int64_t warmup_epochs = 0;               // [--lr-warmup-epochs] 0 = no warm-up; less than train.epochs
  std::string warmup_method = "constant";  // [--lr-warmup-method] "linear" (LinearLR) | "constant" (ConstantLR)
  double warmup_decay = 0.01;              // [--lr-warmup-decay] warm-up's first lr = lr × warmup_decay, in (0, 1]
  int64_t step_size = 30;                  // [--lr-step-size] "step": lr × gamma every step_size epochs (or steps)
  double gamma = 0.1;                      // [--lr-gamma] "step", "exponential" (per epoch, or per step)
  double lr_min = 0.0;                     // [--lr-min] "cosine": eta_min, over T_max = epochs - warmup_epochs

  // torchvision's detection reference ("multistep": references/detection/train.py's MultiStepLR,
  // stepped per epoch, after engine.py's LinearLR warm-up over the first epoch's iterations).
  std::vector<double> milestones = {16, 22};  // [--lr-steps] epochs after which the lr is × gamma
  int64_t warmup_iters = 1000;                // engine.py: min(1000, iterations per epoch - 1); 0 = none
  double warmup_factor = 0.001;               // engine.py: the warm-up's first lr = lr × warmup_factor
};

// M4: the input size of step `step` of a multi-scale run — a pure function of (seed, step), so
// every rank trains the same size at the same step without talking, and a resumed run draws
// what the uninterrupted one drew. `sizes` must not be empty.
int64_t multi_scale_size(uint64_t seed, int64_t step, const std::vector<int64_t>& sizes);

// A schedule's values at each optimizer step.
struct SchedulePoint {
  double lr;
  double momentum;  // AdamW beta1 or SGD momentum for this step
};

// What a schedule is built for: its options, the peak lr, the optimizer's own momentum (used
// when the schedule does not cycle it), the optimizer steps in all and per epoch (0: not given).
struct ScheduleBuild {
  const ScheduleOptions& options;
  double peak_lr;
  double momentum;
  int64_t total_steps;
  int64_t steps_per_epoch;
};

// One schedule's curve: a pure function of the step (clamped to [0, total_steps)).
class ScheduleCurve {
 public:
  virtual ~ScheduleCurve() = default;
  virtual SchedulePoint at(int64_t step) const = 0;
  virtual std::string describe() const = 0;
};

// A schedule in the registry: `declare` binds the keys it reads to `options` (a key several
// schedules share is declared by the first; declare_once), `make` builds its curve and throws
// bad_input naming the key for options it cannot use.
struct ScheduleKind {
  std::function<void(ScheduleOptions& options, ConfigSchema& schema)> declare;
  std::function<std::unique_ptr<const ScheduleCurve>(const ScheduleBuild& build)> make;
};

// Every schedule by name (schedule.name's allowed values), in the order --help lists them.
const Registry<ScheduleKind>& schedule_registry();

// Binds schedule.name and every registered schedule's keys (bind_job_config calls it).
void declare_schedule_settings(ScheduleOptions& options, ConfigSchema& schema);

class Schedule {
 public:
  using Point = SchedulePoint;

  // `momentum` is the optimizer's own (used when the schedule does not cycle it).
  // `steps_per_epoch`: optimizer steps per epoch (with accumulation, steps, not micro-batches);
  // total_steps must be a multiple of it. The torchvision schedules need it; 0 = not given.
  // Throws bad_input naming the key for an unknown name, total_steps < 1 or options the
  // schedule cannot use.
  Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps,
           int64_t steps_per_epoch = 0);

  // The values for optimizer step `step` (0-based, < total_steps).
  Point at(int64_t step) const { return curve_->at(step); }
  int64_t total_steps() const { return total_; }
  std::string describe() const { return curve_->describe(); }

 private:
  int64_t total_;
  std::shared_ptr<const ScheduleCurve> curve_;
};

}  // namespace crucible::train
