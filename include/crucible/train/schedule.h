// Learning-rate (and momentum) schedules as pure functions of the step (T8), so a resumed
// run needs only its step. "onecycle" equals PyTorch's OneCycleLR (cos annealing, two
// phases, momentum cycled between max and base); "warmup_cosine" rises linearly then
// follows a cosine; "constant" holds the peak. "step", "cosine" and "exponential" are
// torchvision's classification reference (references/classification/train.py: StepLR,
// CosineAnnealingLR, ExponentialLR after an optional LinearLR/ConstantLR warm-up chained by
// SequentialLR), equal to torch's chained schedulers at every step. Torch-free, immutable,
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
};

// M4: the input size of step `step` of a multi-scale run — a pure function of (seed, step), so
// every rank trains the same size at the same step without talking, and a resumed run draws
// what the uninterrupted one drew. `sizes` must not be empty.
int64_t multi_scale_size(uint64_t seed, int64_t step, const std::vector<int64_t>& sizes);

class Schedule {
 public:
  struct Point {
    double lr;
    double momentum;  // AdamW beta1 or SGD momentum for this step
  };

  // `momentum` is the optimizer's own (used when the schedule does not cycle it).
  // `steps_per_epoch`: optimizer steps per epoch (with accumulation, steps, not micro-batches);
  // total_steps must be a multiple of it. The torchvision schedules need it; 0 = not given.
  // Throws bad_input naming the key for an unknown name, total_steps < 1 or options the
  // schedule cannot use.
  Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps,
           int64_t steps_per_epoch = 0);

  // The values for optimizer step `step` (0-based, < total_steps).
  Point at(int64_t step) const;
  int64_t total_steps() const { return total_; }
  std::string describe() const;

 private:
  // torchvision's chain: the lr after `n` scheduler steps, and after `n` given the lr after n - 1.
  double chain_at(int64_t n) const;
  double chain_next(double lr, int64_t n) const;
  bool torchvision() const;

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

}  // namespace crucible::train
