// bind_job_config: the reference of every config key (defaults, allowed values, help).
#include "crucible/train/job_config.h"

#include <algorithm>

#include "crucible/core/config.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/data_config.h"
#include "crucible/train/ema_options.h"
#include "crucible/train/multi_scale.h"

namespace crucible::train {

const char* bn_name(DistSection::Bn bn) {
  switch (bn) {
    case DistSection::Bn::kAverage:
      return "average";
    case DistSection::Bn::kSync:
      return "sync";
    case DistSection::Bn::kBroadcast:
      break;
  }
  return "broadcast";
}

namespace {

// [run].
void bind_run(JobConfig& j, ConfigSchema& s) {
  s.add("run", "name", &j.run.name, "run folder name: results go to <dir>/<name>/");
  s.add("run", "dir", &j.run.dir, "folder holding the run folders");
  s.add("run", "seed", &j.run.seed, "the one seed every random stream derives from (T15)").non_negative();
}

// The train pieces' own settings, each declared in the piece's torch-free header. Their
// factories are recipe.cpp's registries, in the torch library, which the torch-free tools that
// read every key (report, the Python module) do not link: so this list names them again.
void declare_train_piece_settings(JobConfig& j, ConfigSchema& s) {
  declare_settings(s, j.pieces.of<MultiScaleOptions>(kMultiScalePiece));
  declare_settings(s, j.pieces.of<EmaOptions>(kEmaPiece));
}

// [train].
void bind_train(JobConfig& j, ConfigSchema& s) {
  s.add("train", "device", &j.train.device, "where to train: auto (a GPU when present), cpu, cuda or cuda:N");
  s.add("train", "epochs", &j.train.epochs, "passes over the training set").min(1);
  s.add("train", "batch_size", &j.train.batch_size, "samples per optimizer step, per rank").min(1);
  s.add("train", "global_batch_size", &j.train.global_batch_size,
        "samples per optimizer step over all ranks, whatever their number (0 = batch_size × ranks); each rank takes "
        "global_batch_size / ranks, and a run resumes on any number of ranks that divides it (elastic, with "
        "data.sampler = \"global\")")
      .non_negative();
  s.add("train", "eval_batch_size", &j.train.eval_batch_size, "samples per evaluation batch").min(1);
  s.add_enum("train", "precision", &j.train.precision, precision_mode_names(),
             "compute precision (bf16/fp16 = autocast mixed precision; auto = bf16 where the CPU computes it in "
             "hardware, else fp32; on a GPU the fastest safe one, timed)");
  s.add("train", "channels_last", &j.train.channels_last, "NHWC memory format for activations and weights");
  s.add("train", "threads", &j.train.threads, "torch compute threads (0 = all cores available)").non_negative();
  s.add("train", "max_steps", &j.train.max_steps, "stop after this many steps (0 = all epochs)").non_negative();
  s.add("train", "accumulate", &j.train.accumulate, "micro-batches per optimizer step (M5; batch_size is split)").min(1);
  s.add("train", "clip_norm", &j.train.clip_norm, "clip the global gradient norm (0 = off)").non_negative();
  s.add("train", "max_bad_steps", &j.train.max_bad_steps, "non-finite steps in a row before exit 3").min(1);
  using LS = TrainSection::LossScaling;
  s.add_enum("train", "loss_scaling", &j.train.loss_scaling, {{"auto", LS::kAuto}, {"on", LS::kOn}, {"off", LS::kOff}},
             "dynamic loss scaling (T1): auto = on for fp16 only");
  s.add("train", "loss_scale", &j.train.loss_scale, "initial dynamic loss scale (T1)").positive();
  s.add("train", "loss_scale_interval", &j.train.loss_scale_interval, "fp16: clean steps before the scale doubles")
      .min(1);
  using PR = TrainSection::Profile;
  s.add_enum("train", "profile", &j.train.profile, {{"off", PR::kOff}, {"light", PR::kLight}, {"full", PR::kFull}},
             "step-time breakdown and bottleneck verdict: light (timers, no sync per phase) | full (and per-layer "
             "forward/backward times; slower) | off");
  s.add("train", "deterministic", &j.train.deterministic, "deterministic algorithms only (M6)");
  s.add("train", "matmul_precision", &j.train.matmul_precision, "float32 matmul precision (T5; TF32 on GPUs)")
      .choices({"highest", "high", "medium"});
  s.add("train", "sync_debug", &j.train.sync_debug, "synchronise after every GPU kernel, as CUDA_LAUNCH_BLOCKING=1 (T14)");
  s.add("train", "release_cache", &j.train.release_cache, "release cached device memory at epoch ends (T13)");
}

// [checkpoint], [log] and [dist].
void bind_outputs_dist(JobConfig& j, ConfigSchema& s) {
  s.add("checkpoint", "every_steps", &j.checkpoint.every_steps, "checkpoint every N steps (and at every epoch end)")
      .min(1);
  s.add("checkpoint", "keep", &j.checkpoint.keep, "checkpoints kept (newest)").min(1);

  s.add("log", "every_steps", &j.log.every_steps, "read metrics and log every N steps").min(1);
  s.add("log", "progress", &j.log.progress, "progress display (auto = bar on a terminal, lines otherwise)")
      .choices({"auto", "bar", "lines", "none"});
  s.add("log", "tensorboard", &j.log.tensorboard, "write TensorBoard event files to <run>/tb (scalars, config, histograms)");
  s.add("log", "histogram_every", &j.log.histogram_every,
        "TensorBoard histograms of every weight and gradient every N steps (0: none)")
      .min(0);

  s.add("dist", "backend", &j.dist.backend, "collective backend: auto (nccl on CUDA, gloo on CPU), gloo, nccl")
      .choices({"auto", "gloo", "nccl"});
  s.add("dist", "timeout_s", &j.dist.timeout_s, "seconds a collective may wait for the other ranks").min(1);
  s.add("dist", "bucket_mb", &j.dist.bucket_mb, "gradient all-reduce bucket size in MiB").min(0.001);
  using Bn = DistSection::Bn;
  s.add_enum("dist", "bn", &j.dist.bn,
             {{"broadcast", Bn::kBroadcast}, {"average", Bn::kAverage}, {"sync", Bn::kSync}},
             "BatchNorm statistics under data parallel (M2): broadcast (rank 0's), average, sync (SyncBatchNorm, M3)");
}

}  // namespace

void bind_job_config(JobConfig& j, ConfigSchema& s) {
  bind_run(j, s);
  data::bind_data_config(j.data, s);  // [data], with the data pieces' own keys
  nn::declare_model_settings(j.model, s);     // [model], with each model's own keys
  declare_optim_settings(j.optim, s);         // [optim], with each optimizer's
  declare_schedule_settings(j.schedule, s);   // [schedule], with each schedule's
  declare_loss_settings(j.loss, s);           // [loss], with each loss's
  bind_train(j, s);
  bind_outputs_dist(j, s);
  declare_train_piece_settings(j, s);
}

int64_t global_batch(const TrainSection& train, int world_size) {
  return train.batch_size * static_cast<int64_t>(world_size);
}

int compute_threads(const JobConfig& job, int local_ranks) {
  return job.train.threads > 0 ? static_cast<int>(job.train.threads)
                               : std::max(1, available_cores() / std::max(1, local_ranks));
}

bool key_is_cosmetic(const std::string& k) {
  return k.rfind("log.", 0) == 0 || k == "checkpoint.every_steps" || k == "checkpoint.keep" || k == "data.threads" ||
         k == "data.prefetch" || k == "data.cache" || k == "data.cache_mb" || k == "train.eval_batch_size" || k == "train.max_steps" ||
         k == "train.sync_debug" || k == "train.profile" || k == "train.release_cache" || k == "dist.timeout_s" || k == "dist.bucket_mb" ||
         k == "dist.backend";
}

std::string resolve_job_toml(const std::string& text, const std::string& source) {
  JobConfig job;
  ConfigSchema schema;
  bind_job_config(job, schema);
  schema.load_string(text, source);
  return schema.to_toml();
}

}  // namespace crucible::train
