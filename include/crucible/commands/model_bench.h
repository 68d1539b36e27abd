// `crucible bench model` (X9): honest timing of a job's model at a batch size — the forward
// alone (inference: eval mode, no autograd) and the whole training step (TrialStep: forward,
// backward, the optimizer) — in every precision and memory format `precision = "auto"` would
// consider. Warm-up runs are excluded, the device is synchronised around each timed run, the
// figures are the median and p90 of the counted runs, and the memory peak is the most bytes held
// in tensors during the measurement (CUDA: the allocator's peak; CPU: every tensor allocation
// counted). Input: one real batch of the job's training data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"
#include "crucible/train/precision.h"

namespace crucible::commands {

struct ModelBenchOptions {
  int64_t batch = 0;           // 0: train.batch_size
  int warmup = 3;              // runs before counting (kernel selection, allocator growth, caches)
  int repeats = 20;            // counted runs at most …
  double seconds = 10;         // … or as many as fit in this many seconds per measurement (at least 3)
  bool all_precisions = true;  // false: the job's precision only (auto: what it picks on a CPU)
};

struct ModelBenchRow {
  train::Precision precision;
  std::string what;  // "forward" | "train_step"
  int runs = 0;      // counted
  double median_ms = 0, p90_ms = 0, min_ms = 0;
  double samples_per_s = 0;  // batch / median
  int64_t peak_bytes = 0;
};

struct ModelBenchResult {
  std::string model;  // the model's description
  std::string device;
  std::string input;  // "256 × 1×28×28"
  int64_t batch = 0;
  int warmup = 0;
  std::vector<ModelBenchRow> rows;
  std::string to_json() const;
  std::string to_text() const;  // a table
};

// p-th percentile (0–100) of `ms` by linear interpolation between order statistics (NumPy's
// default); `ms` must not be empty.
double percentile(std::vector<double> ms, double p);

ModelBenchResult bench_model(const train::JobConfig& job, const ModelBenchOptions& options);

}  // namespace crucible::commands
