// The Trainer is the loop: it assembles the job (job.h), resumes from the newest verified
// checkpoint, then runs epochs of steps — batch transforms, TrainStep, step observers — with
// metrics kept on the device (law 2), evaluation after every epoch through EvalGuard (M1),
// checkpoints, and the run folder (config.toml, metrics.jsonl, train.log, checkpoints/,
// summary.json) through its sinks. Not thread-safe: one Trainer per process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"
#include "crucible/train/precision.h"

namespace crucible::nn {
class Model;
}

namespace crucible::train {

struct TrainFlags {
  bool resume = false;   // require an existing run to continue (a rerun resumes anyway)
  bool restart = false;  // discard the run folder's checkpoints and metrics, start afresh
  // The default job, every key resolved (resolve_job_toml): <run>/report.html, written at every
  // checkpoint and at the end, highlights the keys that differ from it. Empty: no report.
  std::string report_defaults_toml;
};

struct TrainSummary {
  std::string run_dir;
  double test_acc = 0;        // 0–1
  double test_top5 = 0;       // 0–1, top-k with k = min(5, classes)
  double test_loss = 0;
  double train_seconds = 0;   // training steps + evaluations + checkpoint writes, all sessions
  double wall_seconds = 0;    // this process, start to finish
  double samples_per_s = 0;   // training samples / time in training steps
  int64_t steps = 0;
  std::string params_sha256;
  bool already_complete = false;  // nothing to do: the run had finished before
  PrecisionChoice precision;
  // What the last training step ran in (observed, not configured): the logits' dtype
  // ("Float", "BFloat16", "Half"; empty if no step ran) and whether the convolution weights
  // were channels_last.
  std::string step_dtype;
  bool step_channels_last = false;
  int64_t loss_scale_tracker = 0;  // GradScaler's growth counter at the end (T1)
  // This session's bottleneck verdict with its evidence and fix (empty with train.profile = "off").
  std::string bottleneck;
};

class Trainer {
 public:
  explicit Trainer(JobConfig job, TrainFlags flags = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainSummary run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The names in the model, loss and optimizer registries: the allowed values of model.name,
// loss.name and optim.name (pass to bind_job_config).
RegisteredNames registered_names();

// Asks a running Trainer to stop at the next step boundary, checkpoint and return (SIGINT).
void request_stop();

// A user model from Python (TorchScript or torch.export) is, at the end of training, written
// back to its run folder in its own format (Model::save_program: <stem>.ts.pt for
// torch.jit.load, <stem>.pt2 for torch.export's loaders) and as <stem>.safetensors (plain
// state_dict names); false (nothing written) for a model that cannot (the zoo's: their weights
// are the checkpoints' model.* tensors). Rank 0 only (law 4).
bool export_model(nn::Model& model, const std::string& run_dir, const std::string& stem);

namespace testing {
// Test seam (T16): at optimizer step `step`, every micro-batch larger than `max_micro_batch`
// samples fails as an allocation failure would. step < 0 disarms it.
void inject_oom(int64_t step, int64_t max_micro_batch);
// Test seam (M4): with CRUCIBLE_TEST_STEP_TRACE=PREFIX in the environment, each rank appends
// "<step> <input size>" for every training step to PREFIX.rank<R>, and writes what its data
// pipelines say of themselves (describe(), the train's then the test's) to PREFIX.rank<R>.data (X8).
constexpr const char* kStepTraceEnv = "CRUCIBLE_TEST_STEP_TRACE";
// Test seams for the bottleneck verdict: each training sample takes this many milliseconds
// longer to load (input-bound), each gradient sync this many longer to finish
// (communication-bound).
constexpr const char* kSampleDelayEnv = "CRUCIBLE_TEST_SAMPLE_DELAY_MS";
constexpr const char* kAllReduceDelayEnv = "CRUCIBLE_TEST_ALLREDUCE_DELAY_MS";
// Test seam (X8): rank 0 waits this many milliseconds before it opens the data, so a rank that
// did not wait for it would open the data first.
constexpr const char* kRank0OpenDelayEnv = "CRUCIBLE_TEST_RANK0_OPEN_DELAY_MS";
// Test seam (stragglers): "R:MS" makes rank R spend MS milliseconds more on every step, before
// its forward, so the other ranks wait for it at the gradient sync.
constexpr const char* kSlowRankEnv = "CRUCIBLE_TEST_SLOW_RANK";
}  // namespace testing

}  // namespace crucible::train
