// The assembled job of a command that runs a trained model (`crucible eval`, `crucible
// predict`): the weights of a checkpoint — the one given, or the newest that verifies in the
// run folder — loaded into the job its stored choices build (precision, input convention), or
// the config's own weights where the command allows them. Rank 0 decides; every rank loads the
// same file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "crucible/train/job.h"

namespace crucible::commands {

struct InferenceJob {
  std::unique_ptr<train::Job> job;
  std::string checkpoint;  // the file the weights came from (empty: the config's own weights)
  int64_t step = 0;        // its training step (0 for the config's own weights)
  bool ema = false;        // the weights are the checkpoint's weight EMA (ema.*), not its model
};

struct InferenceSource {
  std::string command;          // "eval" | "predict", first word of messages
  std::string checkpoint;       // a file, or empty: the newest that verifies in the run folder
  bool config_weights = false;  // without a checkpoint, the config's model.init or TorchScript module may serve
  std::string hint;             // what to give instead, for the no-checkpoint error
  // "model": the checkpoint's model.* weights; "ema": its weight EMA's (ema.*, a run with
  // train.ema = true): bad_input for a checkpoint without them, or without a checkpoint.
  std::string weights = "model";
};

// bad_input when there is no checkpoint (and no config weights allowed), naming the folder and
// `source.hint`, and for `weights` = "ema" without EMA weights to load.
InferenceJob open_inference_job(train::JobConfig config, const InferenceSource& source);

}  // namespace crucible::commands
