// The Trainer runs a whole job: data, model, optimizer and schedule from a JobConfig; resume
// from the newest verified checkpoint; the training loop with metrics kept on the device
// (law 2); evaluation after every epoch through EvalGuard (M1); checkpoints; and the run
// folder (config.toml, metrics.jsonl, train.log, checkpoints/, summary.json).
// Not thread-safe: one Trainer per process.
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

struct PredictOptions;  // predict.h
struct PredictSummary;

struct TrainFlags {
  bool resume = false;   // require an existing run to continue (a rerun resumes anyway)
  bool restart = false;  // discard the run folder's checkpoints and metrics, start afresh
  // The default job, every key resolved (resolve_job_toml): <run>/report.html, written at every
  // checkpoint and at the end, highlights the keys that differ from it. Empty: no report.
  std::string report_defaults_toml;
};

// How the run's precision and memory format were decided (`train.precision`).
struct PrecisionTiming {
  Precision precision;  // fp32 | bf16, either memory format
  double ms = 0;        // best time of one whole training step on a batch
};
struct PrecisionChoice {
  Precision value;
  std::string source;           // "configured" | "auto" (timed here) | "checkpoint" (a resumed run's)
  std::vector<PrecisionTiming> timed;  // "auto": every candidate, in the order timed
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

  // `crucible eval`: the model of checkpoint `path` (default: the newest that verifies in the
  // run folder) on the whole test set, without writing anything. Under data parallel the test
  // set is sharded, per-sample results gathered and the padding dropped (X2), so the figures
  // equal a single process's. Fills run_dir, test_acc, test_loss, steps, params_sha256.
  TrainSummary evaluate_checkpoint(const std::string& path = "");

  // `crucible predict` (predict.h): the model (options.checkpoint, default as above) on the
  // whole test set, each sample's top-K classes and probabilities written by rank 0 to
  // options.out atomically, in sample order; evaluated as evaluate_checkpoint does, so the
  // file's top-1 accuracy equals its test_acc. bad_input for K < 1, an unknown extension or
  // no checkpoint.
  PredictSummary predict(const PredictOptions& options);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The names in the model, loss and optimizer registries: the allowed values of model.name,
// loss.name and optim.name (pass to bind_job_config).
RegisteredNames registered_names();

// SHA-256 over parameters then buffers in registration order: name, dtype, shape and the
// values in C order (independent of memory format).
std::string params_sha256(nn::Model& model);

// Asks a running Trainer to stop at the next step boundary, checkpoint and return (SIGINT).
void request_stop();

namespace testing {
// Test seam (T16): at optimizer step `step`, every micro-batch larger than `max_micro_batch`
// samples fails as an allocation failure would. step < 0 disarms it.
void inject_oom(int64_t step, int64_t max_micro_batch);
// Test seam (M4): with CRUCIBLE_TEST_STEP_TRACE=PREFIX in the environment, each rank appends
// "<step> <input size>" for every training step to PREFIX.rank<R>.
constexpr const char* kStepTraceEnv = "CRUCIBLE_TEST_STEP_TRACE";
// Test seams for the bottleneck verdict: each training sample takes this many milliseconds
// longer to load (input-bound), each gradient sync this many longer to finish
// (communication-bound).
constexpr const char* kSampleDelayEnv = "CRUCIBLE_TEST_SAMPLE_DELAY_MS";
constexpr const char* kAllReduceDelayEnv = "CRUCIBLE_TEST_ALLREDUCE_DELAY_MS";
}  // namespace testing

}  // namespace crucible::train
