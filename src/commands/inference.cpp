// open_inference_job (see inference.h).
#include "crucible/commands/inference.h"

#include <filesystem>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/distributed/comm.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/run_state.h"

namespace crucible::commands {
namespace {

namespace fs = std::filesystem;

std::string checkpoint_dir(const train::JobConfig& c) {
  return (fs::path(c.run.dir) / c.run.name / "checkpoints").string();
}

// The newest checkpoint that verifies in <run.dir>/<run.name>/checkpoints into `path`; false
// when the folder does not exist or holds none.
bool newest_checkpoint(const train::JobConfig& c, std::string* path) {
  const std::string dir = checkpoint_dir(c);
  return fs::is_directory(dir) && train::CheckpointManager(dir, 1).load_latest(path).has_value();
}

std::string no_checkpoint_reason(const train::JobConfig& c) {
  const std::string dir = checkpoint_dir(c);
  return fs::is_directory(dir) ? fmt::format("{} holds no checkpoint that verifies", dir)
                               : fmt::format("{} does not exist (no run named {} in {})", dir, c.run.name, c.run.dir);
}

}  // namespace

InferenceJob open_inference_job(train::JobConfig config, const InferenceSource& source) {
  InferenceJob out;
  out.job = train::join_job(std::move(config));
  train::Job& job = *out.job;
  job.inference = true;  // the test split alone
  std::string path = source.checkpoint;
  if (job.main_rank() && path.empty() && !newest_checkpoint(job.config, &path) && !source.config_weights) {
    throw bad_input("{}: {}; {}", source.command, no_checkpoint_reason(job.config), source.hint);
  }
  if (job.comm) path = job.comm->broadcast_string(source.command, path, 0);  // empty: the config's own weights
  if (source.weights != "model" && source.weights != "ema") {
    throw bad_input("{} --weights: expected model or ema, found \"{}\"", source.command, source.weights);
  }
  out.ema = source.weights == "ema";
  if (out.ema && path.empty()) {
    throw bad_input("{} --weights ema: there is no checkpoint to take the weight EMA from ({}); give --checkpoint "
                    "FILE of a run trained with train.ema = true",
                    source.command, no_checkpoint_reason(job.config));
  }
  if (path.empty()) {
    train::assemble_job(job, {});  // model.init loads (its log names what it did to the head), or TorchScript's
    return out;
  }
  const train::CheckpointData ckpt = train::read_checkpoint(path);
  if (out.ema && ckpt.meta.count("ema.n_averaged") == 0) {
    throw bad_input("{} --weights ema: {} holds no weight EMA (its run trained with train.ema = false); use "
                    "--weights model",
                    source.command, path);
  }
  train::assemble_job(job, train::StoredChoices::of(ckpt, path));
  train::CheckpointIO::reader(ckpt, path).model(out.ema ? "ema." : "model.", *job.model);
  out.step = ckpt.meta_int("step", path);
  out.checkpoint = path;
  return out;
}

}  // namespace crucible::commands
