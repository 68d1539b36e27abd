// The one file of the train layer that reads the environment (see environment.h).
#include "crucible/train/environment.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "crucible/core/error.h"
#include "crucible/distributed/launch.h"

namespace crucible::train {
namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

double milliseconds(const char* name) {
  const std::string v = variable(name);
  return v.empty() ? 0.0 : std::atof(v.c_str());
}

// A count of batches, -1 when unset or empty.
int64_t batches(const char* name) {
  const std::string v = variable(name);
  if (v.empty()) return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || n < 0) throw bad_input("{}={}: expected a whole number of batches >= 0", name, v);
  return n;
}

std::atomic<int64_t> g_oom_step{-1};
std::atomic<int64_t> g_oom_max{0};

}  // namespace

Environment read_environment() {
  Environment e;
  e.launch_progress_dir = variable(distributed::kProgressDirEnv);
  e.omp_num_threads = variable("OMP_NUM_THREADS");
  TestSeams& s = e.seams;
  s.step_trace = variable(testing::kStepTraceEnv);
  s.sample_delay_ms = milliseconds(testing::kSampleDelayEnv);
  s.allreduce_delay_ms = milliseconds(testing::kAllReduceDelayEnv);
  s.rank0_open_delay_ms = milliseconds(testing::kRank0OpenDelayEnv);
  s.slow_rank_text = variable(testing::kSlowRankEnv);
  int rank = -1;
  double ms = 0;
  if (std::sscanf(s.slow_rank_text.c_str(), "%d:%lf", &rank, &ms) == 2 && ms > 0) {
    s.slow_rank = rank;
    s.slow_rank_ms = ms;
  }
  s.feeder_ahead = batches(testing::kFeederAheadEnv);
  return e;
}

void testing::inject_oom(int64_t step, int64_t max_micro_batch) {
  g_oom_max.store(max_micro_batch);
  g_oom_step.store(step);
}

void testing::fail_if_oom_injected(int64_t step, int64_t samples) {
  if (g_oom_step.load() == step && samples > g_oom_max.load()) {
    throw std::runtime_error("out of memory (injected by the test seam)");
  }
}

}  // namespace crucible::train
