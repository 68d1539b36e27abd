// Every environment variable the train layer reads, read in one place (environment.cpp): the
// launcher's progress folder, OMP_NUM_THREADS (named by the cores check), and the test seams
// (CRUCIBLE_TEST_*), which let tests make a rank slow, a sample late or an allocation fail
// without a code path of their own in the loop or the assembly. The world (RANK, MASTER_ADDR,
// SLURM's variables) is the distributed layer's (world.h). Read when a job is joined, so a test
// that sets a variable between two runs in one process is seen by the second.
#pragma once

#include <cstdint>
#include <string>

namespace crucible::train {

struct TestSeams {
  // CRUCIBLE_TEST_STEP_TRACE=PREFIX (M4, X8): each rank appends "<step> <input size>" for every
  // training step to PREFIX.rank<R> (a detector's size: the step's min_size, 0 for
  // model.min_size), and writes what its data pipelines say of themselves
  // (describe(), the train's then the test's) to PREFIX.rank<R>.data, and the sample ledger —
  // "<step> <epoch> <sample id>…" for every step — to PREFIX.rank<R>.samples. Empty: off.
  std::string step_trace;
  // CRUCIBLE_TEST_SAMPLE_DELAY_MS, CRUCIBLE_TEST_ALLREDUCE_DELAY_MS (the bottleneck verdict):
  // each training sample takes this many milliseconds longer to load (input-bound), each
  // gradient sync this many longer to finish (communication-bound). 0: off.
  double sample_delay_ms = 0;
  double allreduce_delay_ms = 0;
  // CRUCIBLE_TEST_RANK0_OPEN_DELAY_MS (X8): rank 0 waits this long before it opens the data, so
  // a rank that did not wait for it would open the data first. 0: off.
  double rank0_open_delay_ms = 0;
  // CRUCIBLE_TEST_SLOW_RANK="R:MS" (stragglers): rank R spends MS milliseconds more on every
  // step, before its forward, so the other ranks wait for it at the gradient sync.
  std::string slow_rank_text;  // the variable as given, for the log
  int slow_rank = -1;
  double slow_rank_ms = 0;
  // CRUCIBLE_TEST_FEEDER_AHEAD=N (D9): the training batches' feeder keeps N batches queued
  // behind the one the step takes, on any device — on the CPU, where it runs with 0, they are
  // pulled from the loader ahead and converted when handed over. -1 (unset or empty): off.
  int64_t feeder_ahead = -1;
};

struct Environment {
  std::string launch_progress_dir;  // crucible launch's CRUCIBLE_LAUNCH_PROGRESS_DIR (empty: not under it)
  std::string omp_num_threads;      // as set (empty: unset); crucible sets its own thread count
  TestSeams seams;
};

// The variables as they are now. A CRUCIBLE_TEST_FEEDER_AHEAD that is not a whole number >= 0 is
// refused (bad_input, naming it).
Environment read_environment();

namespace testing {
constexpr const char* kStepTraceEnv = "CRUCIBLE_TEST_STEP_TRACE";
constexpr const char* kSampleDelayEnv = "CRUCIBLE_TEST_SAMPLE_DELAY_MS";
constexpr const char* kAllReduceDelayEnv = "CRUCIBLE_TEST_ALLREDUCE_DELAY_MS";
constexpr const char* kRank0OpenDelayEnv = "CRUCIBLE_TEST_RANK0_OPEN_DELAY_MS";
constexpr const char* kSlowRankEnv = "CRUCIBLE_TEST_SLOW_RANK";
constexpr const char* kFeederAheadEnv = "CRUCIBLE_TEST_FEEDER_AHEAD";

// Test seam (T16), set in-process: at optimizer step `step`, every micro-batch larger than
// `max_micro_batch` samples fails as an allocation failure would. step < 0 disarms it.
void inject_oom(int64_t step, int64_t max_micro_batch);
// Throws the allocation failure the injection above asks for, for a micro-batch of `samples` at
// step `step` (TrainStep::before_forward).
void fail_if_oom_injected(int64_t step, int64_t samples);
}  // namespace testing

}  // namespace crucible::train
