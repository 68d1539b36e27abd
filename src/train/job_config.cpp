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

// [model] and [optim] (their names: the registries').
void bind_model_optimization(JobConfig& j, ConfigSchema& s, const RegisteredNames& names) {
  auto& model_name = s.add("model", "name", &j.model.name, "model architecture");
  if (!names.models.empty()) model_name.choices(names.models);
  s.add("model", "dropout", &j.model.dropout, "dropout probability before the last layer").min(0).max(1, true);
  s.add("model", "path", &j.model.path,
        "model.name = \"exported\": the .pt2 archive of crucible.export or torch.export.save; model.name = "
        "\"torchscript\": the module file, saved by torch.jit.save(torch.jit.script(model)) (not traced)");
  s.add("model", "eval_with_train_program", &j.model.eval_with_train_program,
        "model.name = \"exported\" with one program exported in train mode: evaluate with it anyway (dropout on, "
        "BatchNorm on batch statistics)");
  s.add("model", "init", &j.model.init,
        "start from these weights: a torch.save state_dict (.pt) or .safetensors; \"module.\" prefixes are stripped "
        "(X4), a classifier head of another class count is re-initialised (\"\" = the model's own init)");
  s.add("model", "init_ignore", &j.model.init_ignore,
        "model.init: names (glob patterns) allowed to be missing from the file or from the model");
  s.add("model", "freeze", &j.model.freeze,
        "parameters kept fixed (glob patterns over names, e.g. [\"conv1.*\", \"layer1.*\"]): not optimised, not synced");

  auto& optim_name = s.add("optim", "name", &j.optim.name, "optimizer");
  if (!names.optimizers.empty()) optim_name.choices(names.optimizers);
  s.add("optim", "lr", &j.optim.lr, "peak learning rate").positive();
  s.add("optim", "lr_per_256", &j.optim.lr_per_256, "if > 0: lr per 256 samples, scaled by the global batch (T7)")
      .non_negative();
  s.add("optim", "decay_bias_and_norm", &j.optim.decay_bias_and_norm,
        "also decay biases and normalisation weights (T4: off by default)");
  s.add("optim", "weight_decay", &j.optim.weight_decay, "weight decay (decoupled for adamw)").non_negative();
  s.add("optim", "beta1", &j.optim.beta1, "adamw beta1 (cycled by onecycle when cycle_momentum)").min(0).max(1, true);
  s.add("optim", "beta2", &j.optim.beta2, "adamw beta2").min(0).max(1, true);
  s.add("optim", "eps", &j.optim.eps, "adamw epsilon").positive();
  s.add("optim", "momentum", &j.optim.momentum, "sgd momentum").min(0).max(1, true);
  s.add("optim", "nesterov", &j.optim.nesterov, "sgd Nesterov momentum");
}

// [schedule] and [loss] (its names: the registry's).
void bind_schedule_loss(JobConfig& j, ConfigSchema& s, const RegisteredNames& names) {
  s.add("schedule", "name", &j.schedule.name,
        "learning-rate schedule; step, cosine and exponential are torchvision's reference (StepLR, "
        "CosineAnnealingLR, ExponentialLR after an optional warm-up), equal to torch's at every step")
      .choices({"onecycle", "warmup_cosine", "constant", "step", "cosine", "exponential"});
  s.add("schedule", "warmup", &j.schedule.warmup,
        "onecycle/warmup_cosine: fraction of all steps spent rising to the peak lr")
      .min(0)
      .max(1, true);
  s.add("schedule", "div_factor", &j.schedule.div_factor, "onecycle/warmup_cosine: first lr = lr / div_factor").min(1);
  s.add("schedule", "final_div_factor", &j.schedule.final_div_factor,
        "onecycle/warmup_cosine: last lr = first lr / final_div_factor")
      .min(1);
  s.add("schedule", "cycle_momentum", &j.schedule.cycle_momentum, "onecycle: cycle momentum/beta1 inversely to lr");
  s.add("schedule", "base_momentum", &j.schedule.base_momentum, "onecycle: momentum at the peak lr").min(0).max(1, true);
  s.add("schedule", "max_momentum", &j.schedule.max_momentum, "onecycle: momentum at the ends").min(0).max(1, true);
  s.add("schedule", "interval", &j.schedule.interval,
        "step/cosine/exponential: \"epoch\" = the lr changes at epoch boundaries (torchvision's train.py steps its "
        "scheduler once per epoch); \"step\" = the same chain counted in optimizer steps (warm-up, T_max, "
        "step_size in steps)")
      .choices({"epoch", "step"});
  s.add("schedule", "warmup_epochs", &j.schedule.warmup_epochs,
        "step/cosine/exponential (--lr-warmup-epochs): epochs of warm-up before the main schedule, fewer than "
        "train.epochs (0 = none); interval = \"step\": warmup_epochs × steps per epoch steps")
      .non_negative();
  s.add("schedule", "warmup_method", &j.schedule.warmup_method,
        "--lr-warmup-method: linear (LinearLR: lr × warmup_decay rising to lr) or constant (ConstantLR: lr × "
        "warmup_decay throughout)")
      .choices({"linear", "constant"});
  s.add("schedule", "warmup_decay", &j.schedule.warmup_decay,
        "--lr-warmup-decay: the warm-up starts at lr × warmup_decay")
      .positive()
      .max(1);
  s.add("schedule", "step_size", &j.schedule.step_size,
        "step (--lr-step-size): lr × gamma every step_size epochs (interval = \"step\": optimizer steps)")
      .min(1);
  s.add("schedule", "gamma", &j.schedule.gamma,
        "step/exponential (--lr-gamma): the factor per step_size epochs (step) or per epoch (exponential); per "
        "optimizer step with interval = \"step\"")
      .positive();
  s.add("schedule", "lr_min", &j.schedule.lr_min,
        "cosine (--lr-min): eta_min, reached at T_max = epochs - warmup_epochs")
      .non_negative();

  auto& loss_name = s.add("loss", "name", &j.loss.name, "training loss");
  if (!names.losses.empty()) loss_name.choices(names.losses);
  s.add("loss", "label_smoothing", &j.loss.label_smoothing, "cross_entropy: label smoothing").min(0).max(1, true);
  s.add("loss", "class_weights", &j.loss.class_weights,
        "cross_entropy: one weight per class, in label order ([] = all equal)")
      .non_negative();
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

void bind_job_config(JobConfig& j, ConfigSchema& s, const RegisteredNames& names) {
  bind_run(j, s);
  data::bind_data_config(j.data, s);  // [data], with the data pieces' own keys
  bind_model_optimization(j, s, names);
  bind_schedule_loss(j, s, names);
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
