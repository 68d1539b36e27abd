// Training progress for a person to watch (rank 0 only, law 4). On a terminal: one bar
// redrawn in place (epoch, steps, loss, accuracy, samples/s, ETA). Elsewhere (a log file,
// CI): one plain line per log interval. Metrics arrive once per log interval (law 2); the
// bar's step counter and rates move every step. Torch-free. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace crucible::obs {

enum class ProgressMode { kBar, kLines, kNone };

// "auto" → bar on a terminal, lines otherwise; "bar" | "lines" | "none" as said.
ProgressMode parse_progress_mode(const std::string& text, bool is_terminal);

struct TrainReading {
  int64_t step = 0;       // global optimizer steps done
  double loss = 0;        // mean over the interval
  double accuracy = 0;    // 0–1, over the interval
  double lr = 0;
  double samples_per_s = 0;
  std::string verdict;    // the interval's bottleneck ("input-bound (41%)"), empty when not profiled
  bool has_accuracy = true;  // false for a detector's records (its loss terms, no accuracy)
};

class Progress {
 public:
  Progress(ProgressMode mode, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps);
  ~Progress();

  // Step `step` (global, 1-based count of steps done) finished; redraws the bar at most ~10×/s.
  void step_done(int64_t step, int64_t epoch);
  // A log interval's metrics: lines mode prints one line; bar mode updates its fields.
  void reading(const TrainReading& r, int64_t epoch);
  // Clears the bar so that a summary line can be printed.
  void clear();

  // "1:23" / "1:02:03"
  static std::string format_duration(double seconds);

 private:
  void draw(int64_t step, int64_t epoch);

  ProgressMode mode_;
  int64_t epochs_, steps_per_epoch_, total_steps_;
  TrainReading last_{};
  bool have_reading_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t start_step_ = -1;
};

}  // namespace crucible::obs
