// The configuration of a training job, section by section, exactly as the TOML reads: each
// field is one `section.key`, its initializer is the default, and bind_job_config() registers
// it with its help text and allowed values (so `crucible train --help`, the resolved
// config.toml and this struct are the same thing). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/config.h"
#include "crucible/data/loader.h"
#include "crucible/data/pipeline.h"
#include "crucible/nn/model_options.h"
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

struct DataSection {
  // idx: IDX image + label files; arrays: .npy/.npz/.safetensors features + labels in the same
  // four keys; images: encoded images (train_path/test_path)
  enum class Dataset { kIdx, kArrays, kImages };
  Dataset dataset = Dataset::kIdx;
  std::string train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  std::string train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";
  std::string test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  std::string test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  std::string train_path;     // "images": an image folder, tar shards, an LMDB folder or a packed index
  std::string test_path;
  int64_t crop = 224;         // "images": output size (RandomResizedCrop for training, centre crop for tests)
  // FixRes (torchvision's --train-crop-size 176, --val-resize-size 232, --val-crop-size 224): the
  // evaluation's crop and short side, apart from the training crop. 0: crop, and int(crop / 0.875).
  int64_t eval_crop = 0;
  int64_t eval_resize = 0;
  data::CacheMode cache = data::CacheMode::kNone;  // images: none | encoded | decoded (D1)
  int64_t cache_mb = 0;       // budget of that cache
  std::string jpeg_decode = "fast";  // "fast" (fast IDCT, merged upsampling) | "accurate"
  bool jpeg_dct_scaling = true;  // decode a JPEG at the smallest DCT scale that covers the output (D2)
  bool exif_orientation = true;  // turn photos as their EXIF orientation tag says
  std::string color_order = "RGB";  // D3: channel order the pipeline delivers ("BGR" only when asked)
  data::BadSamplePolicy bad_samples = data::BadSamplePolicy::kFail;  // D5: fail | skip
  int64_t train_samples = 0;  // 0 = all
  int64_t test_samples = 0;   // 0 = all
  // Automatic augmentation after the crop and flip (data/augment.h, torchvision's v2 transforms):
  // none | randaugment | trivialaugment_wide | autoaugment | augmix, with their options.
  std::string augment = "none";
  int64_t augment_num_ops = 2;       // randaugment: ops per sample
  int64_t augment_magnitude = 9;     // randaugment: the magnitude bin
  int64_t augment_bins = 31;         // randaugment, trivialaugment_wide: magnitude bins
  std::string augment_policy = "imagenet";  // autoaugment: imagenet | cifar10 | svhn
  std::string augment_interpolation = "auto";  // auto (torchvision's default per transform) | nearest | bilinear
  std::vector<double> augment_fill;  // pixel levels outside geometric ops: [] (zeros, as fill=None), 1 or 3 values
  int64_t augmix_severity = 3;
  int64_t augmix_width = 3;
  int64_t augmix_depth = -1;         // -1: 1 to 3 ops per chain at random
  double augmix_alpha = 1.0;
  bool augmix_all_ops = true;
  // After normalisation, on the device (train/mixup.h), as torchvision's RandomErasing: p (0 = off),
  // the area fraction and aspect ratio ranges, the value(s) in normalised units.
  double random_erase = 0.0;
  std::vector<double> random_erase_scale = {0.02, 0.33};
  std::vector<double> random_erase_ratio = {0.3, 3.3};
  std::vector<double> random_erase_value = {0.0};
  // MixUp / CutMix on the device (Beta(α, α)); with both, one of them per batch. 0 = off.
  double mixup_alpha = 0.0;
  double cutmix_alpha = 0.0;
  std::string sampler = "distributed";  // the training order (train/data_recipe.cpp's sampler registry)
  int64_t repeats = 3;  // sampler "repeated": copies of each sample an epoch (torchvision train.py's --ra-reps)
  std::vector<double> mean = {0.2860};
  std::vector<double> std = {0.3530};
  std::string mean_std_range = "unit";  // D4: the units of mean/std: "unit" (0-1) or "byte" (0-255)
  std::string mean_std_order = "RGB";   // D3: the channel order mean/std are listed in
  int64_t threads = 0;                  // loader threads; 0 = 1 per 2 cores, at least 1
  int64_t prefetch = 4;
};

struct TrainSection {
  std::string device = "auto";  // "auto" (a GPU when there is one) | "cpu" | "cuda" | "cuda:N"
  int64_t epochs = 10;
  int64_t batch_size = 256;
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
  // M4: input sizes (square) to train at, one per step drawn from (seed, step) — the same on
  // every rank; empty = the data's own size. Evaluation uses the data's size.
  std::vector<double> multi_scale;
  // Weight EMA (train/ema.h), torchvision's --model-ema: an average of the parameters and
  // buffers updated every ema_steps loader iterations, evaluated after every epoch beside the
  // model (test_acc_ema) and kept in every checkpoint.
  bool ema = false;
  double ema_decay = 0.99998;  // [--model-ema-decay]
  int64_t ema_steps = 32;      // [--model-ema-steps]
  bool ema_adjust = true;      // decay adjusted as train.py does: 1 − min(1, (1 − ema_decay) × world × batch × ema_steps / epochs)
};

// The training loss (a registry name, train/loss.h) and its options.
struct LossSection {
  std::string name = "cross_entropy";
  double label_smoothing = 0.1;       // cross_entropy: label smoothing
  std::vector<double> class_weights;  // cross_entropy: one weight per class ([] = equal)
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
  // The settings each registered piece declares in its own file (sample transforms:
  // data_recipe.cpp's registry), by the piece's name: JobConfig collects them, bind_job_config
  // binds them, the piece's factory reads them.
  PieceOptions pieces;
};

// The names the registries hold (models, losses, optimizers): the allowed values of
// model.name, loss.name and optim.name. Empty lists leave those keys unchecked at parse time
// (torch-free tools); the registry lookup still names an unknown one.
struct RegisteredNames {
  std::vector<std::string> models, losses, optimizers;
};

// Registers every field of `job` in `schema` (job must outlive schema).
void bind_job_config(JobConfig& job, ConfigSchema& schema, const RegisteredNames& names = {});

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
