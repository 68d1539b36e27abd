// Learning-rate (and momentum) schedules as pure functions of the step (T8), so a resumed
// run needs only its step. "onecycle" equals PyTorch's OneCycleLR (cos annealing, two
// phases, momentum cycled between max and base); "warmup_cosine" rises linearly then
// follows a cosine; "constant" holds the peak. Torch-free, immutable, thread-safe.
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
  // Throws bad_input for an unknown name or total_steps < 1.
  Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps);

  // The values for optimizer step `step` (0-based, < total_steps).
  Point at(int64_t step) const;
  int64_t total_steps() const { return total_; }
  std::string describe() const;

 private:
  ScheduleOptions opt_;
  double peak_;
  double momentum_;
  int64_t total_;
};

}  // namespace crucible::train
