// The configuration of a training job, section by section, exactly as the TOML reads: each
// field is one `section.key`, its initializer is the default, and bind_job_config() registers
// it with its help text and allowed values (so `crucible train --help`, the resolved
// config.toml and this struct are the same thing). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/config.h"
#include "crucible/data/data_config.h"
#include "crucible/nn/model_options.h"
#include "crucible/train/loss_options.h"
#include "crucible/train/optim_options.h"
#include "crucible/train/precision.h"
#include "crucible/train/schedule.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::train {

struct RunSection {
  std::string name = "fashion_mnist";
  std::string dir = "runs";
  int64_t seed = 0;
};

// [data]: the data layer's (data/data_config.h), with its pieces' settings.
using DataSection = data::DataConfig;

struct TrainSection {
  std::string device = "auto";  // "auto" (a GPU when there is one) | "cpu" | "cuda" | "cuda:N"
  int64_t epochs = 10;
  int64_t batch_size = 256;
  // The samples of one step over every rank, fixed whatever the world size (0: batch_size × ranks):
  // each rank then takes global_batch_size / ranks, and a checkpoint resumes at any world size
  // that divides it (data.sampler = "global": the same samples each step).
  int64_t global_batch_size = 0;
  int64_t eval_batch_size = 1000;
  // fp32 | bf16 | fp16 | auto (a CPU: bf16 where it computes bf16 in hardware, else fp32; a GPU:
  // the fastest safe choice, timed)
  PrecisionMode precision = PrecisionMode::kAuto;
  bool channels_last = true;
  int64_t threads = 0;   // torch intra-op threads; 0 = every core this process may use
  int64_t max_steps = 0; // stop after this many steps (0 = run every epoch)
  int64_t accumulate = 1;      // M5: micro-batches per optimizer step (batch_size is split)
  double clip_norm = 0.0;      // clip the global gradient norm to this (0 = off), after unscaling
  int64_t max_bad_steps = 3;   // non-finite loss/gradients this many steps in a row → exit 3
  enum class LossScaling { kAuto, kOn, kOff };
  LossScaling loss_scaling = LossScaling::kAuto;  // T1: auto (on for fp16) | on | off
  double loss_scale = 65536.0;         // GradScaler: initial scale (T1)
  int64_t loss_scale_interval = 2000;  // clean steps before the scale grows ×2
  bool deterministic = false;  // M6: deterministic algorithms only
  std::string matmul_precision = "high";  // T5: float32 matmul precision: "highest" | "high" | "medium"
  bool sync_debug = false;     // T14: synchronise after every kernel (CUDA_LAUNCH_BLOCKING=1), warn at host syncs
  bool release_cache = true;   // T13: release cached device memory at every epoch end
  // The step-time breakdown and bottleneck verdict: "light" (host clocks on CPU, events on
  // CUDA; no sync per phase) | "full" (light, plus each layer's forward and backward time from
  // torch's profiler hooks: costs steps, on CUDA a sync per layer) | "off".
  enum class Profile { kOff, kLight, kFull };
  Profile profile = Profile::kLight;
};

struct CheckpointSection {
  int64_t every_steps = 100;
  int64_t keep = 3;
};

struct LogSection {
  int64_t every_steps = 50;
  std::string progress = "auto";  // "auto" | "bar" | "lines" | "none"
  bool tensorboard = true;         // runs/<name>/tb/events.out.tfevents.*
  int64_t histogram_every = 0;     // weight and gradient histograms every N steps (0: none)
};

// Data parallel (used when the process runs under crucible launch, torchrun or SLURM with
// WORLD_SIZE > 1; ignored in a single process).
struct DistSection {
  std::string backend = "auto";   // "auto" (nccl on CUDA, gloo on CPU) | "gloo" | "nccl"
  double timeout_s = 300;         // a collective waiting longer than this fails, naming the missing rank
  double bucket_mb = 25;          // gradient all-reduce bucket size (communication overlaps backward)
  enum class Bn { kBroadcast, kAverage, kSync };
  Bn bn = Bn::kBroadcast;  // M2: BatchNorm statistics: broadcast (rank 0's) | average | sync (M3)
};

struct JobConfig {
  RunSection run;
  DataSection data;
  nn::ModelOptions model;
  OptimOptions optim;
  ScheduleOptions schedule;
  LossSection loss;
  TrainSection train;
  CheckpointSection checkpoint;
  LogSection log;
  DistSection dist;
  // The settings each registered train piece (a batch transform, a step observer: recipe.cpp)
  // declares in its own header, by the piece's name: JobConfig collects them, bind_job_config
  // binds them (train_piece_settings), the piece's factory reads them. The data pieces' are
  // data.pieces.
  PieceOptions pieces;
};

// Registers every field of `job` in `schema` (job must outlive schema). The names model.name,
// loss.name, optim.name and schedule.name allow are their settings registries' (torch-free).
void bind_job_config(JobConfig& job, ConfigSchema& schema);

// A job's TOML text (`source` names it in errors) with every key resolved, as TOML: the default
// job a report compares a run's config against.
std::string resolve_job_toml(const std::string& text, const std::string& source);

// "broadcast" | "average" | "sync"
const char* bn_name(DistSection::Bn bn);

// Keys whose change does not alter the result of a run (so resuming with them changed is
// allowed): logging, checkpoint cadence, loader threads.
bool key_is_cosmetic(const std::string& full_name);

// The samples of one optimizer step over every rank: train.batch_size per rank × `world_size`
// (the batch lr_per_256 scales by, T7, and the weight EMA's adjustment counts).
int64_t global_batch(const TrainSection& train, int world_size);

// The compute threads each of `local_ranks` processes on this machine uses: train.threads, or
// (0) the cores available shared among them.
int compute_threads(const JobConfig& job, int local_ranks);

}  // namespace crucible::train
