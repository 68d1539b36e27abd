// A Session owns one run of a command on a job: it opens the run and finishes it, and what
// runs between (the training loop, an evaluation, predictions, a preview) is the command's.
//
// Opening, written once for train, eval, predict and preview:
//   join the world (job.h's join_job) → the run folder and its lock (train) → the checkpoint,
//   chosen on rank 0 and broadcast (X3) → the choices it stored (precision, input convention,
//   classes) → the job assembled with them → the disk check (train) → its state restored
//   (train: model, optimizer, RunState, observers; eval/predict: the weights asked for).
// Finishing (train): the model written to the folder in its own format, the observers' end,
// the sinks' end, summary.json and report.html.
// Not thread-safe: one Session per process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "crucible/train/job.h"
#include "crucible/train/run_state.h"
#include "crucible/train/summary.h"
#include "crucible/train/trainer.h"

namespace crucible::obs {
class MetricSinks;
}

namespace crucible::train {

class RunDir;
struct WeightSet;

// The weights a command that runs a trained model takes (eval, predict).
struct WeightsRequest {
  std::string command;          // "eval" | "predict", first word of messages
  std::string checkpoint;       // a file, or empty: the newest that verifies in the run folder
  bool config_weights = false;  // without a checkpoint, the config's model.init or TorchScript module may serve
  std::string hint;             // what to give instead, for the no-checkpoint error
  // A weight set a checkpoint holds (weight_set.h): "model", or one a step observer declares
  // ("ema"); bad_input for a checkpoint without it, or without a checkpoint.
  std::string weights = "model";
};

class Session {
 public:
  // train: the run folder (created, locked; --restart cleans it first), the newest checkpoint
  // that verifies (--resume requires one), the job assembled with its stored choices and its
  // state restored, the sinks made (and rewound to the checkpoint).
  static std::unique_ptr<Session> open_train(JobConfig config, TrainFlags flags);
  // eval, predict: the test split alone and the weights `request` asks for.
  static std::unique_ptr<Session> open_inference(JobConfig config, const WeightsRequest& request);
  // preview: the data stages alone (compute threads, pipelines, loaders).
  static std::unique_ptr<Session> open_preview(JobConfig config);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Job& job() { return *job_; }
  // train only.
  RunDir& dir() { return *dir_; }
  RunState& state() { return st_; }
  SessionRecord& record() { return record_; }
  obs::MetricSinks& sinks() { return *sinks_; }
  // The last step the job trains to (train.max_steps or the epochs' end).
  int64_t stop_step() const;
  // The run had finished before this session (trained and evaluated to stop_step()).
  bool already_complete() const;

  // The checkpoint the weights or the state came from (empty: none), its step, and the weight
  // set taken from it (eval, predict).
  const std::string& checkpoint() const { return checkpoint_; }
  int64_t checkpoint_step() const { return checkpoint_step_; }
  const std::string& weights() const { return weights_; }
  const WeightSet& weight_set() const;

  // train: the end of the run. `trained`: this session ran the loop (false: the run was
  // already complete, and only its summary is rewritten).
  TrainSummary finish(bool trained);

 private:
  Session();
  void choose_checkpoint(std::optional<CheckpointData>* ckpt);
  void check_disk();
  void restore(const std::optional<CheckpointData>& ckpt);
  TrainSummary summarize(bool already_complete);

  TrainFlags flags_;
  std::unique_ptr<Job> job_;
  std::unique_ptr<RunDir> dir_;
  RunState st_;
  SessionRecord record_;
  std::unique_ptr<obs::MetricSinks> sinks_;
  std::string checkpoint_;
  int64_t checkpoint_step_ = 0;
  std::string weights_ = "model";
  std::chrono::steady_clock::time_point wall_start_ = std::chrono::steady_clock::now();
};

// A user model from Python (TorchScript or torch.export) is, at the end of training, written
// back to its run folder in its own format (Model::save_program: <stem>.ts.pt for
// torch.jit.load, <stem>.pt2 for torch.export's loaders) and as <stem>.safetensors (plain
// state_dict names); false (nothing written) for a model that cannot (the zoo's: their weights
// are the checkpoints' model.* tensors). Rank 0 only (law 4).
bool export_model(nn::Model& model, const std::string& run_dir, const std::string& stem);

}  // namespace crucible::train
