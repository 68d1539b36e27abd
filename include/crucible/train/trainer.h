// The Trainer trains a job: a Session opens the run (session.h: the run folder, the newest
// verified checkpoint, the job assembled with its stored choices, the state restored), the loop
// runs epochs of steps — batch transforms, TrainStep, step observers — with metrics kept on the
// device (law 2), evaluation after every epoch through EvalGuard (M1) and checkpoints, and the
// Session finishes the run (the model written out, summary.json, the report). Not thread-safe:
// one Trainer per process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"
#include "crucible/train/precision.h"

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
  std::vector<double> test_coco;  // a detector's: COCO's 12 numbers (data::coco_stat_names order); then
                                  // test_acc, test_top5 and test_loss are -1
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

// Asks a running Trainer to stop at the next step boundary, checkpoint and return (SIGINT).
void request_stop();

}  // namespace crucible::train
