// `crucible tune batch` (T17): the largest training batch that fits a memory budget (on CPU,
// counted through compat::CpuMemoryBudget: parameters, gradients, optimizer state and
// activations of one full step) or the device, found by doubling then bisecting — instead of
// trial and error with whole runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"

namespace crucible::commands {

struct TuneTry {
  int64_t batch = 0;
  bool fits = false;
  int64_t peak_bytes = 0;  // CPU budget only
  double seconds = 0;
};

struct TuneResult {
  int64_t batch = 0;  // the largest that fits (≤ max_batch)
  int64_t peak_bytes = 0;
  std::vector<TuneTry> tries;
};

// Tries one training step (forward, backward, optimizer) of `job` at each candidate batch.
// budget_bytes > 0 bounds CPU tensor memory; throws bad_input when not even one sample fits.
TuneResult tune_batch(const train::JobConfig& job, int64_t budget_bytes, int64_t max_batch);

}  // namespace crucible::commands
