// Trainer: the training loop and the run folder (see trainer.h).
#include "crucible/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/sha256.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/device_input.h"
#include "crucible/data/loader.h"
#include "crucible/data/sampler.h"
#include "crucible/data/source.h"
#include "crucible/dist/comm.h"
#include "crucible/dist/grad_sync.h"
#include "crucible/dist/world.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/nn/lint.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/model.h"
#include "crucible/obs/jsonl.h"
#include "crucible/obs/progress.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/data_setup.h"
#include "crucible/train/grad_scaler.h"
#include "crucible/train/schedule.h"
#include "crucible/train/step.h"

#ifndef CRUCIBLE_VERSION
#define CRUCIBLE_VERSION "0.0.0"
#endif

namespace crucible::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::atomic<bool> g_stop{false};

// Test seam (T16): at step `g_oom_step`, any micro-batch larger than `g_oom_max` fails as if
// the allocator had run out of memory.
std::atomic<int64_t> g_oom_step{-1};
std::atomic<int64_t> g_oom_max{0};

struct SimulatedOom : std::runtime_error {
  SimulatedOom() : std::runtime_error("out of memory (injected by the test seam)") {}
};

// CPU and CUDA allocators both report through c10::Error; std::bad_alloc from plain new.
bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr || dynamic_cast<const SimulatedOom*>(&e) != nullptr) {
    return true;
  }
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Position and totals of a run: everything a checkpoint needs besides tensors.
struct RunState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // current epoch (0-based)
  int64_t batch_in_epoch = 0;  // batches of `epoch` already trained on
  int64_t samples = 0;         // training samples consumed
  double step_seconds = 0;     // time in training steps (all sessions)
  double train_seconds = 0;    // steps + evaluation (all sessions)
  double data_wait_seconds = 0;
  int64_t interval_samples = 0;  // samples in the current log interval
  double interval_seconds = 0;   // time in steps of the current log interval
  double last_test_acc = -1, last_test_loss = 0;
  int64_t last_eval_step = -1;
};

c10::ScalarType autocast_dtype(const std::string& precision) {
  return precision == "fp16" ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

}  // namespace

void request_stop() { g_stop.store(true); }

namespace testing {
void inject_oom(int64_t step, int64_t max_micro_batch) {
  g_oom_max.store(max_micro_batch);
  g_oom_step.store(step);
}
}  // namespace testing

std::string params_sha256(torch::nn::Module& module) {
  Sha256 h;
  auto add = [&h](const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    h.update(fmt::format("{}:{}:{}:{}\n", name.size(), name, c10::toString(c.scalar_type()), fmt::join(c.sizes(), ",")));
    h.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) add(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) add(b.key(), b.value());
  return h.hex_digest();
}

struct Trainer::Impl {
  JobConfig job;
  TrainFlags flags;
  Clock::time_point wall_start = Clock::now();

  std::string run_dir;
  std::unique_ptr<data::Loader> train_loader, test_loader;
  std::unique_ptr<data::DeviceInput> input;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Schedule> schedule;
  std::unique_ptr<CheckpointManager> checkpoints;
  c10::Device device{c10::kCPU};
  bool autocast = false;
  c10::ScalarType amp_dtype = c10::ScalarType::BFloat16;
  int64_t steps_per_epoch = 0, total_steps = 0;
  RunState st;
  std::optional<int64_t> resumed_from;
  // Metrics of the current log interval, on the device (law 2).
  at::Tensor loss_sum, correct;
  // With train.clip_norm: the largest global gradient norm of the interval before clipping and
  // after it (measured on the clipped gradients), on the device.
  at::Tensor grad_norm_max, clipped_norm_max;
  GradScaler scaler;
  std::vector<std::string> param_names;  // parallel to params, for naming a non-finite gradient
  std::vector<at::Tensor> params;
  int64_t bad_in_row = 0;      // non-finite steps in a row
  int64_t skipped_steps = 0;   // over the whole run
  int64_t oom_retries = 0;     // batches re-run as smaller micro-batches (T16)
  PrecisionChoice choice;         // as configured, resumed, or timed ("auto")
  MicroBatchRecord ran;           // what the last step ran in (logits dtype, weights' layout)
  std::unique_ptr<FILE, int (*)(FILE*)> step_trace{nullptr, &std::fclose};  // test seam (M4)
  std::string stored_precision;     // the choice a resumed run made ("" = none)
  std::optional<nn::InputSpec> stored_input;  // the input a checkpoint's model was trained on
  std::string stored_input_source;
  nn::InputSpec model_input;                  // what the model takes (saved in checkpoints)
  bool stored_channels_last = false;
  std::string determinism_env;  // what set_deterministic did to the environment (for the log)
  // Data parallel (law 7): one process per device; null comm = a single process.
  dist::World world;
  std::unique_ptr<dist::Comm> comm;
  std::unique_ptr<dist::GradSync> grad_sync;
  bool stop_agreed = false;  // every rank stops at the same step (SIGINT on any rank)
  nn::LocalCollective local_collective;  // dist.bn = sync in a single process
  std::vector<int64_t> scales;           // M4: train.multi_scale sizes (empty = off)
  bool main_rank() const { return world.rank == 0; }

  Impl(JobConfig j, TrainFlags f) : job(std::move(j)), flags(f) {}

  std::string resolved_toml() {
    ConfigSchema schema;
    bind_job_config(job, schema);
    return schema.to_toml();
  }

  void prepare_run_dir();
  void join_world();
  void sync_bn_buffers();
  void verify_replicas();
  void build();
  void restore(const CheckpointData& ckpt, const std::string& path);
  CheckpointData snapshot();
  void save_checkpoint();
  void evaluate(obs::JsonlWriter* metrics);  // null: nothing written (ranks other than 0)
  void train_step(const data::Batch& batch, const Schedule::Point& sp);
  void choose_precision(const data::SamplePipeline& pipeline, const data::ImageSpec& spec, int64_t classes);
  void forward_backward(const data::Batch& batch, int64_t parts, double scale);
  void read_interval(obs::JsonlWriter* metrics, obs::Progress& progress, double lr, double momentum);
  TrainSummary summarize(bool already_complete);
  TrainSummary run();
  TrainSummary evaluate_checkpoint(std::string path);
  void load_model(const CheckpointData& ckpt, const std::string& path);
  void take_stored_choices(const CheckpointData& ckpt, const std::string& path);
};

void Trainer::Impl::prepare_run_dir() {
  run_dir = (fs::path(job.run.dir) / job.run.name).string();
  const std::string ckpt_dir = (fs::path(run_dir) / "checkpoints").string();
  if (!main_rank()) {  // rank 0 owns the run folder (law 4); the others read its checkpoints
    checkpoints = std::make_unique<CheckpointManager>(ckpt_dir, job.checkpoint.keep);
    return;
  }
  const bool existed = fs::exists(run_dir);
  if (flags.resume && !existed) {
    throw bad_input("--resume: run folder {} does not exist (nothing to resume; drop --resume to start)", run_dir);
  }
  if (flags.restart && existed) {
    log_info("--restart: discarding the previous run in {}", run_dir);
    for (const char* f : {"metrics.jsonl", "summary.json", "train.log", "config.toml"}) fs::remove(fs::path(run_dir) / f);
    fs::remove_all(ckpt_dir);
  }
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec) throw runtime_error("cannot create run folder {}: {}", ckpt_dir, ec.message());
  checkpoints = std::make_unique<CheckpointManager>(ckpt_dir, job.checkpoint.keep);

  // A rerun into an existing run continues it, but only with the same job (cosmetic keys such
  // as logging may change).
  const std::string config_path = (fs::path(run_dir) / "config.toml").string();
  const std::string toml = resolved_toml();
  if (fs::exists(config_path) && !checkpoints->list().empty()) {
    JobConfig stored_job;
    ConfigSchema stored;
    bind_job_config(stored_job, stored);
    stored.load_file(config_path);
    ConfigSchema now;
    bind_job_config(job, now);
    auto a = stored.values(), b = now.values();
    std::string diffs;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].second != b[i].second && !key_is_cosmetic(a[i].first)) {
        diffs += fmt::format("\n  {}: run has {}, now {}", a[i].first, a[i].second, b[i].second);
      }
    }
    if (!diffs.empty()) {
      throw bad_input("run folder {} holds a run with a different configuration:{}\nresume it with its own config, "
                      "choose another run.name, or pass --restart to discard it",
                      run_dir, diffs);
    }
  }
  write_file_atomic(config_path, toml);
  set_log_file((fs::path(run_dir) / "train.log").string());
}

// Joins the data-parallel job this process was started in (crucible launch, torchrun, SLURM
// through their variables), if any: device from LOCAL_RANK before any collective (T2), then
// the rendezvous and the process group.
void Trainer::Impl::join_world() {
  world = dist::world_from_env();
  set_log_rank(world.rank);
  // Before anything touches CUDA (resolve_device below counts the GPUs): the driver reads
  // CUDA_LAUNCH_BLOCKING when it starts (T14) and cuBLAS reads CUBLAS_WORKSPACE_CONFIG when its
  // first handle is made (M6); set later, both silently do nothing.
  if (job.train.sync_debug) compat::enable_sync_debug();
  determinism_env = compat::set_deterministic(job.train.deterministic);
  device = compat::resolve_device(job.train.device);
  if (!world.launched) return;
  if (device.is_cuda()) {
    dist::check_devices(world, compat::cuda_device_count());
    device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(world.local_rank));
    compat::bind_device(device);
  }
  dist::CommOptions co;
  co.backend = job.dist.backend;
  co.timeout_s = job.dist.timeout_s;
  const auto t0 = Clock::now();
  comm = dist::Comm::connect(world, device, co);
  log_info("data parallel: {} processes, {} backend, device {} per process from LOCAL_RANK, timeout {:.0f} s; "
           "joined in {:.1f} s",
           world.size, comm->backend(), device.str(), job.dist.timeout_s, seconds_since(t0));
}

// M2: running statistics equal on every rank before anything reads them.
void Trainer::Impl::sync_bn_buffers() {
  if (comm && job.dist.bn != "sync") dist::sync_buffers(*comm, model->module(), job.dist.bn);
}

// The replicas must hold the same weights; a cheap fingerprint per rank is compared at every
// checkpoint so a divergence is caught where it starts, not in a worse model.
void Trainer::Impl::verify_replicas() {
  if (!comm) return;
  at::NoGradGuard no_grad;
  at::Tensor fp = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& p : params) {
    const at::Tensor d = p.detach().to(at::kDouble);
    fp[0] += d.sum();
    fp[1] += d.abs().sum();
  }
  const at::Tensor all = comm->all_gather(fp).to(at::kCPU);
  for (int r = 1; r < world.size; ++r) {
    if (!at::equal(all[r], all[0])) {
      throw runtime_error("step {}: rank {} holds different weights from rank 0 (fingerprints {:.17g}/{:.17g} vs "
                          "{:.17g}/{:.17g}); the replicas diverged",
                          st.step, r, all[r][0].item<double>(), all[r][1].item<double>(), all[0][0].item<double>(),
                          all[0][1].item<double>());
    }
  }
}

void Trainer::Impl::build() {
  const uint64_t seed = static_cast<uint64_t>(job.run.seed);
  // Compute threads: this machine's cores shared by its processes.
  const int threads = job.train.threads > 0 ? static_cast<int>(job.train.threads)
                                            : std::max(1, available_cores() / std::max(1, world.local_size));
  compat::set_num_threads(threads);
  const bool tuned = tune_host_allocator();
  log_info("crucible {} on libtorch {}: {} compute thread(s), device {}{}", CRUCIBLE_VERSION, compat::torch_version(),
           compat::num_threads(), device.str(), tuned ? ", host allocator tuned" : "");
  log_info("seed {} → streams: init {}, sampler {}, augment {}, dropout {} (T15)", seed,
           derive_seed(seed, RngStream::kInit), derive_seed(seed, RngStream::kSampler),
           derive_seed(seed, RngStream::kAugment), derive_seed(seed, RngStream::kDropout));

  // Data.
  const auto t0 = Clock::now();
  DataSetup ds = make_data(job, derive_seed(seed, RngStream::kAugment));
  const data::ImageSpec spec = ds.train->output_spec();
  log_info("data: {} training and {} test samples of {} ({} classes), opened in {:.1f} s", ds.train->size(),
           ds.test->size(), spec.to_string(), ds.num_classes, seconds_since(t0));
  log_info("train pipeline: {}", ds.train->describe());

  data::NormalizeOptions norm{job.data.mean, job.data.std,
                              data::parse_value_range(job.data.mean_std_range, "data.mean_std_range"),
                              data::parse_color_order(job.data.mean_std_order, "data.mean_std_order")};
  int loader_threads = static_cast<int>(job.data.threads);
  std::string chosen;
  if (loader_threads == 0) {
    // D10: in-RAM arrays need little; decoded images get the count measured fastest.
    const int cores = std::max(1, available_cores() / std::max(1, world.local_size));
    loader_threads = job.data.dataset == "idx" ? std::max(1, threads / 2)
                                               : data::choose_loader_threads(*ds.train, cores, &chosen);
  }
  data::LoaderOptions train_options = loader_options(job, job.train.batch_size, loader_threads);
  data::LoaderOptions test_options = loader_options(job, job.train.eval_batch_size, loader_threads);
  train_options.allocate = test_options.allocate = data::DeviceInput::batch_allocator(device);  // D9
  // X1: each rank's shard is DistributedSampler's for (seed, epoch, world, rank); evaluation
  // shards sequentially with padding, and the padding is dropped after the gather (X2).
  const data::Sampler::Shard shard{world.size, world.rank, /*drop_last=*/false};
  train_loader = std::make_unique<data::Loader>(
      ds.train, data::Sampler(ds.train->size(), /*shuffle=*/true, derive_seed(seed, RngStream::kSampler), shard),
      train_options);
  test_loader =
      std::make_unique<data::Loader>(ds.test, data::Sampler(ds.test->size(), false, 0, shard), test_options);
  steps_per_epoch = train_loader->batches_per_epoch();
  total_steps = steps_per_epoch * job.train.epochs;


  // Model: weights from the init stream, then torch's generator moves to the dropout stream.
  compat::seed_cpu_generator(derive_seed(seed, RngStream::kInit));
  const int64_t classes = ds.num_classes;
  model = nn::make_model(job.model, spec.channels, spec.height, spec.width, classes);
  model->module().to(device);
  model->module().train();
  compat::seed_cpu_generator(derive_seed(seed, RngStream::kDropout));
  compat::seed_device_generator(device, derive_seed(seed, RngStream::kDropout));
  log_info("model: {}, {} parameters", model->describe(), nn::parameter_count(*model));
  for (const auto& w : nn::lint_bias_before_norm(model->module())) log_warn("model lint (M7): {}", w);

  // Precision and memory format: as configured, as a resumed run chose, or timed here (auto).
  if (!stored_precision.empty()) {
    choice.precision = stored_precision;
    choice.channels_last = stored_channels_last;
    choice.source = "checkpoint";
  } else if (job.train.precision == "auto") {
    // Timed on rank 0 alone; every rank takes its choice (replicas must compute alike).
    choice.source = "auto";
    if (main_rank()) choose_precision(*ds.train, spec, classes);
    if (comm) {
      const std::string pick = comm->broadcast_string(
          "precision", choice.precision + (choice.channels_last ? "+cl" : ""), 0);
      choice.channels_last = pick.size() > 3 && pick.compare(pick.size() - 3, 3, "+cl") == 0;
      choice.precision = choice.channels_last ? pick.substr(0, pick.size() - 3) : pick;
    }
  } else {
    choice.precision = job.train.precision;
    choice.channels_last = job.train.channels_last;
    choice.source = "configured";
  }
  if (choice.channels_last) nn::to_channels_last(*model);
  for (double s : job.train.multi_scale) {
    if (s != std::floor(s) || s < 4 || s > 4096) {
      throw bad_input("train.multi_scale: {} is not a size in pixels (an integer 4–4096)", s);
    }
    scales.push_back(static_cast<int64_t>(s));
  }
  if (const char* trace = std::getenv(testing::kStepTraceEnv); trace != nullptr && *trace != '\0') {
    const std::string path = fmt::format("{}.rank{}", trace, world.rank);
    step_trace.reset(std::fopen(path.c_str(), "a"));
    if (!step_trace) throw runtime_error("{}={}: cannot open {}", testing::kStepTraceEnv, trace, path);
  }
  if (!scales.empty()) {
    log_info("multi-scale (M4): each step trains at one of {} px (square), drawn from (seed, step) — the same "
             "size on every rank at the same step; evaluation at {}x{}",
             fmt::join(scales, ", "), spec.height, spec.width);
  }
  input = std::make_unique<data::DeviceInput>(spec, norm, device, choice.channels_last);
  // Law 3: the input the model takes — as built, or as trained (a checkpoint's) — against what
  // the pipeline delivers; a model trained here keeps the pipeline's convention from now on.
  const nn::InputSpec expected = stored_input ? *stored_input : model->input_spec();
  nn::check_input(expected, input->delivers(),
                  stored_input ? "the model in " + stored_input_source : "model " + job.model.name);
  model_input = expected.order ? expected : expected.trained_on(input->delivers());
  log_info("input: {}; loader: {}, prefetch {}, bad samples: {}", input->describe(),
           chosen.empty() ? fmt::format("{} thread(s)", loader_threads) : chosen, job.data.prefetch,
           job.data.bad_samples);
  if (choice.precision != "fp32") {
    amp_dtype = autocast_dtype(choice.precision);
    if (!compat::autocast_supported(device.type(), amp_dtype)) {
      throw bad_input("train.precision = \"{}\": libtorch {} has no {} autocast on {}; use \"bf16\" or \"fp32\"",
                      choice.precision, compat::torch_version(), choice.precision, device.str());
    }
    autocast = true;
  }
  GradScalerOptions so;
  // bf16 keeps fp32's exponent range: scaling is for fp16 (or when asked for).
  so.enabled = job.train.loss_scaling == "on" || (job.train.loss_scaling == "auto" && choice.precision == "fp16");
  so.init_scale = job.train.loss_scale;
  so.interval = job.train.loss_scale_interval;
  scaler = GradScaler(so);
  log_info("precision: {}{}, memory format {}{}", choice.precision, autocast ? " (autocast mixed precision)" : "",
           choice.channels_last ? "channels_last" : "contiguous",
           scaler.enabled() ? fmt::format(", dynamic loss scale from {}", scaler.scale()) : "");

  // Determinism (M6) and device settings (T5, T9, T14).
  // (set_deterministic and enable_sync_debug ran in join_world, before the device started)
  if (job.train.deterministic) {
    log_info("deterministic algorithms on (M6{}); still free to differ: results across thread counts (BLAS and "
             "reduction splits), library versions and devices, and any op without a deterministic kernel (it "
             "raises)",
             determinism_env.empty() ? "" : "; set " + determinism_env);
  }
  compat::set_matmul_precision(job.train.matmul_precision);
  compat::set_cudnn_benchmark(!job.train.deterministic);  // T9: every batch has the pipeline's fixed shape
  if (job.train.sync_debug) {
    log_info("sync debug (T14): every GPU kernel is synchronised (CUDA_LAUNCH_BLOCKING=1), errors point at their "
             "own line, and torch warns at every host synchronisation (sync-debug mode {})",
             compat::sync_debug_mode());
  }

  // Optimizer and schedule. T4: no weight decay on biases and normalisation weights (1-D).
  ParamGroup decay, no_decay;
  decay.weight_decay = job.optim.weight_decay;
  no_decay.weight_decay = job.optim.decay_bias_and_norm ? job.optim.weight_decay : 0.0;
  for (const auto& p : model->module().named_parameters(true)) {
    (p.value().dim() <= 1 ? no_decay : decay).params.push_back({p.key(), p.value()});
    param_names.push_back(p.key());
    params.push_back(p.value());
  }
  log_info("parameter groups (T4): {} tensors with weight decay {}, {} biases/norm weights with {}", decay.params.size(),
           decay.weight_decay, no_decay.params.size(), no_decay.weight_decay);
  optimizer = make_optimizer(job.optim, {decay, no_decay});
  if (!comm && job.dist.bn == "sync") {
    // One process computes what N processes compute: the same SyncBatchNorm numerics (statistics
    // combined in double), so a run can be compared across world sizes. torch's CPU kernel
    // accumulates channels_last statistics in float (relative error ~4e-4 measured at batch 256).
    const int n = nn::convert_sync_batchnorm(model->module(), &local_collective);
    log_info("dist.bn = sync in one process: {} BatchNorm layer(s) use the SyncBatchNorm computation", n);
  }
  if (comm) {
    // M3: SyncBatchNorm before gradient sync is set up; then DDP's reducer (M5, T11).
    if (job.dist.bn == "sync") {
      const int n = nn::convert_sync_batchnorm(model->module(), comm.get());
      log_info("dist.bn = sync: {} BatchNorm layer(s) take statistics over all {} ranks (M3)", n, world.size);
    } else {
      log_info("dist.bn = {}: BatchNorm statistics per rank, made equal ({}) before evaluation and checkpoints (M2)",
               job.dist.bn, job.dist.bn == "broadcast" ? "rank 0's" : "averaged");
    }
    grad_sync = std::make_unique<dist::GradSync>(*comm, params, job.dist.bucket_mb);
    log_info("gradient sync: {}, all-reduced during backward", grad_sync->describe());
  }
  const int64_t global_batch = job.train.batch_size * world.size;
  const double lr = job.optim.lr_per_256 > 0 ? job.optim.lr_per_256 * static_cast<double>(global_batch) / 256.0
                                             : job.optim.lr;
  if (job.optim.lr_per_256 > 0) {
    log_info("lr = {} per 256 samples × global batch {}{} / 256 = {} (T7)", job.optim.lr_per_256, global_batch,
             comm ? fmt::format(" ({} ranks × {})", world.size, job.train.batch_size) : "", lr);
  }
  const double momentum = job.optim.name == "adamw" ? job.optim.beta1 : job.optim.momentum;
  schedule = std::make_unique<Schedule>(job.schedule, lr, momentum, total_steps);
  log_info("optimizer: {}; schedule: {}", optimizer->describe(), schedule->describe());
  log_info("training: {} epochs × {} steps of batch {}{}{} = {} steps; checkpoint every {} steps, keep {}",
           job.train.epochs, steps_per_epoch, job.train.batch_size,
           comm ? fmt::format(" per rank × {} ranks = {}", world.size, global_batch) : std::string(),
           job.train.accumulate > 1 ? fmt::format(" ({} micro-batches)", job.train.accumulate) : "", total_steps,
           job.checkpoint.every_steps, job.checkpoint.keep);

  loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  grad_norm_max = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  clipped_norm_max = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

CheckpointData Trainer::Impl::snapshot() {
  CheckpointData d;
  for (const auto& p : model->module().named_parameters(true)) d.tensors.push_back({"model." + p.key(), p.value()});
  for (const auto& b : model->module().named_buffers(true)) d.tensors.push_back({"model." + b.key(), b.value()});
  for (auto& s : optimizer->state()) d.tensors.push_back({"optim." + s.name, s.tensor});
  d.tensors.push_back({"rng.torch_cpu", compat::cpu_generator_state()});
  if (device.is_cuda()) d.tensors.push_back({"rng.torch_cuda", compat::generator_state(device)});  // its dropout
  d.tensors.push_back({"metrics.loss_sum", loss_sum});
  d.tensors.push_back({"metrics.correct", correct});
  d.tensors.push_back({"metrics.grad_norm_max", grad_norm_max});
  d.tensors.push_back({"metrics.clipped_norm_max", clipped_norm_max});
  auto& m = d.meta;
  m["step"] = std::to_string(st.step);
  m["epoch"] = std::to_string(st.epoch);
  m["batch_in_epoch"] = std::to_string(st.batch_in_epoch);
  m["samples"] = std::to_string(st.samples);
  m["interval_samples"] = std::to_string(st.interval_samples);
  m["interval_seconds"] = fmt::format("{:.17g}", st.interval_seconds);
  m["step_seconds"] = fmt::format("{:.17g}", st.step_seconds);
  m["train_seconds"] = fmt::format("{:.17g}", st.train_seconds);
  m["data_wait_seconds"] = fmt::format("{:.17g}", st.data_wait_seconds);
  m["last_test_acc"] = fmt::format("{:.17g}", st.last_test_acc);
  m["last_test_loss"] = fmt::format("{:.17g}", st.last_test_loss);
  m["last_eval_step"] = std::to_string(st.last_eval_step);
  m["total_steps"] = std::to_string(total_steps);
  m["precision"] = choice.precision;
  m["memory_format"] = choice.channels_last ? "channels_last" : "contiguous";
  m["model_input"] = model_input.to_json();  // law 3
  scaler.save(d);  // T1
  m["skipped_steps"] = std::to_string(skipped_steps);
  m["bad_in_row"] = std::to_string(bad_in_row);
  m["oom_retries"] = std::to_string(oom_retries);
  m["config"] = resolved_toml();
  m["crucible_version"] = CRUCIBLE_VERSION;
  m["torch_version"] = compat::torch_version();
  return d;
}

void Trainer::Impl::load_model(const CheckpointData& ckpt, const std::string& path) {
  at::NoGradGuard no_grad;
  for (const auto& item : {model->module().named_parameters(true), model->module().named_buffers(true)}) {
    for (const auto& p : item) {
      const std::string name = "model." + p.key();
      const at::Tensor* src = ckpt.find(name);
      if (src == nullptr) throw bad_input("{}: checkpoint lacks tensor '{}'", path, name);
      if (src->sizes() != p.value().sizes()) {
        throw bad_input("{}: tensor '{}' has shape [{}], the model needs [{}]", path, name,
                        fmt::join(src->sizes(), ", "), fmt::join(p.value().sizes(), ", "));
      }
      at::Tensor d = p.value();
      d.copy_(*src);
    }
  }
}

// A resumed or evaluated run keeps the precision and memory format it chose (auto may time
// differently now) and the input convention its model was trained on (law 3).
void Trainer::Impl::take_stored_choices(const CheckpointData& ckpt, const std::string& path) {
  auto p = ckpt.meta.find("precision");
  auto f = ckpt.meta.find("memory_format");
  if (p != ckpt.meta.end() && f != ckpt.meta.end()) {
    stored_precision = p->second;
    stored_channels_last = f->second == "channels_last";
  }
  if (auto in = ckpt.meta.find("model_input"); in != ckpt.meta.end()) {
    stored_input = nn::InputSpec::from_json(in->second, path);
    stored_input_source = path;
  }
}

TrainSummary Trainer::Impl::evaluate_checkpoint(std::string path) {
  join_world();
  run_dir = (fs::path(job.run.dir) / job.run.name).string();
  const std::string ckpt_dir = (fs::path(run_dir) / "checkpoints").string();
  if (main_rank() && path.empty()) {
    if (!fs::is_directory(ckpt_dir)) {
      throw bad_input("eval: {} does not exist (no run named {} in {}); give --checkpoint FILE or the run's "
                      "run.dir/run.name",
                      ckpt_dir, job.run.name, job.run.dir);
    }
    if (!CheckpointManager(ckpt_dir, 1).load_latest(&path)) {
      throw bad_input("eval: {} holds no checkpoint that verifies", ckpt_dir);
    }
  }
  if (comm) path = comm->broadcast_string("eval", path, 0);
  const CheckpointData ckpt = read_checkpoint(path);
  take_stored_choices(ckpt, path);
  build();
  load_model(ckpt, path);
  st.step = ckpt.meta_int("step", path);
  evaluate(nullptr);
  TrainSummary s;
  s.run_dir = path;
  s.test_acc = st.last_test_acc;
  s.test_loss = st.last_test_loss;
  s.steps = st.step;
  s.params_sha256 = params_sha256(model->module());
  s.wall_seconds = seconds_since(wall_start);
  return s;
}

void Trainer::Impl::restore(const CheckpointData& ckpt, const std::string& path) {
  at::NoGradGuard no_grad;
  auto load = [&](const std::string& name, const at::Tensor& dst) {
    const at::Tensor* src = ckpt.find(name);
    if (src == nullptr) throw bad_input("{}: checkpoint lacks tensor '{}'", path, name);
    if (src->sizes() != dst.sizes()) {
      throw bad_input("{}: tensor '{}' has shape [{}], the model needs [{}]", path, name, fmt::join(src->sizes(), ", "),
                      fmt::join(dst.sizes(), ", "));
    }
    at::Tensor d = dst;
    d.copy_(*src);
  };
  for (const auto& p : model->module().named_parameters(true)) load("model." + p.key(), p.value());
  for (const auto& b : model->module().named_buffers(true)) load("model." + b.key(), b.value());
  std::vector<NamedTensor> optim_state;
  const std::string prefix = "optim.";
  for (const auto& t : ckpt.tensors) {
    if (t.name.rfind(prefix, 0) == 0) optim_state.push_back({t.name.substr(prefix.size()), t.tensor});
  }
  optimizer->load_state(optim_state);
  const at::Tensor* rng = ckpt.find("rng.torch_cpu");
  if (rng == nullptr) throw bad_input("{}: checkpoint lacks tensor 'rng.torch_cpu'", path);
  compat::set_cpu_generator_state(*rng);
  if (device.is_cuda()) {
    if (const at::Tensor* cuda_rng = ckpt.find("rng.torch_cuda")) {
      compat::set_generator_state(device, *cuda_rng);
    } else {
      log_warn("{}: no GPU generator state (saved by a CPU run, or before it was kept): dropout on {} draws "
               "from a fresh stream, so this resume is not bit-exact",
               path, device.str());
    }
  }
  load("metrics.loss_sum", loss_sum);
  load("metrics.correct", correct);
  for (auto* t : {&grad_norm_max, &clipped_norm_max}) t->zero_();  // absent in checkpoints before issue 10
  if (ckpt.find("metrics.grad_norm_max") != nullptr) load("metrics.grad_norm_max", grad_norm_max);
  if (ckpt.find("metrics.clipped_norm_max") != nullptr) load("metrics.clipped_norm_max", clipped_norm_max);
  st.step = ckpt.meta_int("step", path);
  st.epoch = ckpt.meta_int("epoch", path);
  st.batch_in_epoch = ckpt.meta_int("batch_in_epoch", path);
  st.samples = ckpt.meta_int("samples", path);
  st.interval_samples = ckpt.meta_int("interval_samples", path);
  st.interval_seconds = ckpt.meta_double("interval_seconds", path);
  st.step_seconds = ckpt.meta_double("step_seconds", path);
  st.train_seconds = ckpt.meta_double("train_seconds", path);
  st.data_wait_seconds = ckpt.meta_double("data_wait_seconds", path);
  st.last_test_acc = ckpt.meta_double("last_test_acc", path);
  st.last_test_loss = ckpt.meta_double("last_test_loss", path);
  st.last_eval_step = ckpt.meta_int("last_eval_step", path);
  scaler.restore(ckpt, path);
  skipped_steps = ckpt.meta_int("skipped_steps", path);
  bad_in_row = ckpt.meta_int("bad_in_row", path);
  oom_retries = ckpt.meta_int("oom_retries", path);
  if (ckpt.meta_int("total_steps", path) != total_steps) {
    throw bad_input("{}: checkpoint was written for {} total steps, this job has {}", path,
                    ckpt.meta_int("total_steps", path), total_steps);
  }
}

void Trainer::Impl::save_checkpoint() {
  const auto t0 = Clock::now();
  sync_bn_buffers();
  verify_replicas();
  if (!main_rank()) return;  // law 4: rank 0 writes; the replicas are equal
  const std::string path = checkpoints->save(st.step, snapshot());
  const double secs = seconds_since(t0);
  st.train_seconds += secs;  // part of training time, though written before it is counted
  log_info("checkpoint step {} → {} ({:.2f} s)", st.step, path, secs);
}

void Trainer::Impl::evaluate(obs::JsonlWriter* metrics) {
  const auto t0 = Clock::now();
  sync_bn_buffers();  // M2: every rank evaluates with the same statistics
  // X2/X5: per-sample results (sample id, loss, correct) kept on the device, gathered from
  // every rank, the sampler's padding dropped (first occurrence of each id kept), and the
  // metrics computed once over the whole test set in id order, as a single process would.
  std::vector<at::Tensor> ids, losses, hits;
  {
    nn::EvalGuard guard(model->module());  // M1: eval mode + no grad, restored after
    compat::AutocastGuard amp(device.type(), amp_dtype, autocast);
    test_loader->start_epoch(0);
    while (auto batch = test_loader->next()) {
      at::Tensor x = input->images(*batch);
      at::Tensor y = input->labels(*batch);
      at::Tensor logits = model->forward(x);
      losses.push_back(at::cross_entropy_loss(logits, y, {}, at::Reduction::None).to(at::kDouble));
      hits.push_back(logits.argmax(1).eq(y).to(at::kDouble));
      ids.push_back(at::tensor(batch->sample_ids, at::kLong).to(device).to(at::kDouble));
    }
  }
  const auto dev = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor local = ids.empty() ? at::zeros({0, 3}, dev)
                                 : at::stack({at::cat(ids), at::cat(losses), at::cat(hits)}, 1);  // [n, 3]
  at::Tensor all = comm ? comm->all_gather_varying(local) : local;
  all = all.to(at::kCPU).contiguous();
  const int64_t rows = all.size(0);
  const double* r = all.data_ptr<double>();
  std::vector<std::pair<int64_t, int64_t>> order;  // (sample id, row), first occurrence of each id
  order.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order.emplace_back(static_cast<int64_t>(r[3 * i]), i);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double loss_total = 0, correct_total = 0;
  int64_t n = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i].first == order[i - 1].first) continue;  // padding
    loss_total += r[3 * order[i].second + 1];
    correct_total += r[3 * order[i].second + 2];
    ++n;
  }
  st.last_test_loss = loss_total / static_cast<double>(std::max<int64_t>(1, n));
  st.last_test_acc = correct_total / static_cast<double>(std::max<int64_t>(1, n));
  st.last_eval_step = st.step;
  const double secs = seconds_since(t0);
  st.train_seconds += secs;
  if (metrics != nullptr) metrics->write({{"type", "eval"},
                 {"step", st.step},
                 {"epoch", st.epoch + (st.batch_in_epoch == steps_per_epoch ? 1 : 0)},
                 {"test_loss", st.last_test_loss},
                 {"test_acc", st.last_test_acc},
                 {"samples", n},
                 {"seconds", secs},
                 {"train_seconds", st.train_seconds}});
  log_info("eval after step {}: test accuracy {:.2f}%, loss {:.4f} ({} samples{}, {:.1f} s)", st.step,
           100 * st.last_test_acc, st.last_test_loss, n,
           comm ? fmt::format(" over {} ranks", world.size) : std::string(), secs);
}

// precision = "auto": times forward + backward of each safe candidate on a scratch copy of the
// model and one real batch, picks the fastest and says why. The scratch model is initialised
// from a saved generator state, so the run's own random streams are untouched.
void Trainer::Impl::choose_precision(const data::SamplePipeline& pipeline, const data::ImageSpec& spec,
                                     int64_t classes) {
  const at::Tensor rng_state = compat::cpu_generator_state();
  const at::Tensor device_rng_state = device.is_cuda() ? compat::generator_state(device) : at::Tensor();
  const int64_t n = std::min<int64_t>(job.train.batch_size, pipeline.size());
  const data::Batch batch = data::sample_batch(pipeline, n);
  struct Candidate {
    std::string precision;
    bool channels_last;
    double ms = 0;
  };
  std::vector<Candidate> candidates = {{"fp32", false}, {"fp32", true}};
  if (compat::autocast_supported(device.type(), c10::ScalarType::BFloat16)) {
    candidates.push_back({"bf16", false});
    candidates.push_back({"bf16", true});
  }
  const data::NormalizeOptions norm{job.data.mean, job.data.std,
                                    data::parse_value_range(job.data.mean_std_range, "data.mean_std_range"),
                                    data::parse_color_order(job.data.mean_std_order, "data.mean_std_order")};
  for (auto& c : candidates) {
    auto scratch = nn::make_model(job.model, spec.channels, spec.height, spec.width, classes);
    scratch->module().to(device);
    if (c.channels_last) nn::to_channels_last(*scratch);
    data::DeviceInput in(spec, norm, device, c.channels_last);
    const at::Tensor x = in.images(batch), y = in.labels(batch);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      {
        compat::AutocastGuard amp(device.type(), c10::ScalarType::BFloat16, c.precision == "bf16");
        at::Tensor loss = at::cross_entropy_loss(scratch->forward(x), y);
        loss.backward();
        (void)loss.item<float>();  // waits for the device, so the clock measures the work
      }
      for (auto& p : scratch->module().parameters()) p.mutable_grad().reset();
      if (rep >= 1) best = std::min(best, seconds_since(t0) * 1000.0);  // the first is warm-up
    }
    c.ms = best;
  }
  compat::set_cpu_generator_state(rng_state);
  if (device_rng_state.defined()) compat::set_generator_state(device, device_rng_state);
  const Candidate* pick = &candidates[0];
  std::string table;
  choice.timed.clear();
  for (const auto& c : candidates) {
    table += fmt::format("{}{} {} {:.1f} ms", table.empty() ? "" : ", ", c.precision,
                         c.channels_last ? "channels_last" : "contiguous", c.ms);
    choice.timed.push_back({c.precision, c.channels_last, c.ms});
    if (c.ms < pick->ms) pick = &c;
  }
  choice.precision = pick->precision;
  choice.channels_last = pick->channels_last;
  log_info("precision auto: forward+backward of a batch of {}: {} → {} + {} (the fastest; fp16 is not a "
           "candidate: it needs a loss scaler and has no CPU autocast in every libtorch)",
           n, table, choice.precision, choice.channels_last ? "channels_last" : "contiguous");
}

// One pass over `batch` split into `parts` micro-batches (M5, T16), at this step's size (M4).
void Trainer::Impl::forward_backward(const data::Batch& batch, int64_t parts, double scale) {
  at::Tensor x = input->images(batch);
  const at::Tensor y = input->labels(batch);
  if (!scales.empty()) {
    // M4: this step's size, the same on every rank (a function of seed and step).
    const int64_t size = multi_scale_size(static_cast<uint64_t>(job.run.seed), st.step, scales);
    if (size != x.size(2) || size != x.size(3)) {
      x = at::upsample_bilinear2d(x, {size, size}, /*align_corners=*/false);
    }
  }
  if (step_trace) {
    std::fprintf(step_trace.get(), "%lld %lld\n", static_cast<long long>(st.step), static_cast<long long>(x.size(2)));
  }
  MicroBatchOptions o;
  o.parts = parts;
  o.label_smoothing = job.train.label_smoothing;
  o.autocast = autocast;
  o.amp_dtype = amp_dtype;
  o.loss_scale = scale;
  o.before_forward = [this](int64_t samples) {
    if (g_oom_step.load() == st.step && samples > g_oom_max.load()) throw SimulatedOom();
  };
  if (grad_sync) o.before_backward = [this](bool last) { grad_sync->communicate(last); };  // M5: only the last
  ran = accumulate_gradients(*model, x, y, o, loss_sum, correct);
}

void Trainer::Impl::train_step(const data::Batch& batch, const Schedule::Point& sp) {
  // M5: `accumulate` micro-batches per step; T16: on an allocation failure, the same batch
  // again as twice as many micro-batches, until one sample alone does not fit.
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(job.train.accumulate, batch.size()));
  const at::Tensor saved_loss_sum = loss_sum.clone(), saved_correct = correct.clone();
  for (;;) {
    try {
      forward_backward(batch, parts, scaler.enabled() ? scaler.scale() : 1.0);
      break;
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      if (comm) {
        // Retrying would change this rank's collectives (buckets may be in flight): stop.
        throw runtime_error("step {}: out of memory on rank {} under data parallel, where a batch cannot be "
                            "retried in pieces; lower train.batch_size or raise train.accumulate: {}",
                            st.step, world.rank, e.what());
      }
      optimizer->zero_grad();
      loss_sum.copy_(saved_loss_sum);
      correct.copy_(saved_correct);
      compat::release_cached_memory(device);
      if (parts >= batch.size()) {
        throw runtime_error("step {}: out of memory with a single sample (sample ids {}{}): {}", st.step,
                            fmt::join(batch.sample_ids.begin(), batch.sample_ids.begin() + std::min<size_t>(8, batch.sample_ids.size()), ", "),
                            batch.sample_ids.size() > 8 ? ", …" : "", e.what());
      }
      const int64_t before = parts;
      parts = std::min<int64_t>(parts * 2, batch.size());
      ++oom_retries;
      log_warn("step {}: out of memory with micro-batches of {} samples; retrying the batch as {} micro-batches of "
               "about {} (T16)",
               st.step, (batch.size() + before - 1) / before, parts, (batch.size() + parts - 1) / parts);
    }
  }
  if (grad_sync) grad_sync->finish();  // gradients averaged over ranks
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  scaler.unscale(grads);  // T1: unscaled before clipping
  if (job.train.clip_norm > 0) {
    at::NoGradGuard no_grad;
    at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (const auto& g : grads) {
      if (g.defined()) total.add_(g.detach().to(at::kFloat).pow(2).sum());
    }
    // No host read: the factor is clamped on the device, as torch.nn.utils.clip_grad_norm_ does.
    const at::Tensor norm = total.sqrt();
    const at::Tensor factor = (job.train.clip_norm / (norm + 1e-6)).clamp_max(1.0);
    at::Tensor clipped = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (const auto& g : grads) {
      if (!g.defined()) continue;
      const_cast<at::Tensor&>(g).mul_(factor);
      clipped.add_(g.detach().to(at::kFloat).pow(2).sum());
    }
    grad_norm_max.copy_(at::maximum(grad_norm_max, norm));
    clipped_norm_max.copy_(at::maximum(clipped_norm_max, clipped.sqrt()));
  }
  // The one host read of the step: are loss and gradients finite (needed to skip the step).
  std::vector<at::Tensor> checked = grads;
  checked.push_back(loss_sum);
  bool finite = true;
  if (comm) {
    // Ranks decide together: [any rank non-finite, any rank asked to stop], one small
    // all-reduce and still one host read per step.
    at::NoGradGuard no_grad;
    at::Tensor flags = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(device));
    at::Tensor ok = at::ones({}, at::TensorOptions().dtype(at::kBool).device(device));
    for (const auto& t : checked) {
      if (t.defined()) ok = at::logical_and(ok, at::isfinite(t).all());
    }
    flags[0] = at::logical_not(ok).to(at::kFloat);
    flags[1] = g_stop.load() ? 1.0 : 0.0;
    comm->all_reduce_sum(flags);
    const at::Tensor host = flags.to(at::kCPU);
    finite = host[0].item<float>() == 0.0f;
    stop_agreed = host[1].item<float>() > 0.0f;
  } else {
    finite = all_finite(checked);
  }
  const bool take = scaler.update(!finite);
  if (take) {
    optimizer->step(sp.lr, sp.momentum);
    bad_in_row = 0;
  } else {
    ++skipped_steps;
    ++bad_in_row;
    std::vector<std::string> names = {"loss"};
    std::vector<at::Tensor> tensors = {loss_sum};
    names.insert(names.end(), param_names.begin(), param_names.end());
    tensors.insert(tensors.end(), grads.begin(), grads.end());
    const std::string bad = first_non_finite(names, tensors);
    const std::string what = bad == "loss" ? "the loss" : "the gradient of " + bad;
    if (bad_in_row >= job.train.max_bad_steps) {
      optimizer->zero_grad();
      throw diverged("training diverged: {} is not finite at step {} ({} bad steps in a row, train.max_bad_steps = "
                     "{}); the last good checkpoint in {} is intact",
                     what, st.step, bad_in_row, job.train.max_bad_steps, checkpoints->dir());
    }
    log_warn("step {}: {} is not finite; step skipped{} ({} of {} allowed in a row)", st.step, what,
             scaler.enabled() ? fmt::format(", loss scale now {}", scaler.scale()) : "", bad_in_row,
             job.train.max_bad_steps);
    // The interval's metrics must not carry the non-finite values.
    loss_sum.copy_(saved_loss_sum);
    correct.copy_(saved_correct);
  }
  optimizer->zero_grad();  // T10: set to none
}

void Trainer::Impl::read_interval(obs::JsonlWriter* metrics, obs::Progress& progress, double lr, double momentum) {
  // The one host read of the interval (law 2); under data parallel the sums of every rank.
  // Gradient norms are of the averaged gradients, equal on every rank: the sum over ranks / N.
  at::Tensor sums = at::stack({loss_sum.to(at::kDouble), correct.to(at::kDouble),
                               at::scalar_tensor(static_cast<double>(st.interval_samples),
                                                 at::TensorOptions().dtype(at::kDouble).device(device)),
                               grad_norm_max.to(at::kDouble), clipped_norm_max.to(at::kDouble)});
  if (comm) comm->all_reduce_sum(sums);
  const at::Tensor host = sums.to(at::kCPU);
  const double samples = std::max(1.0, host[2].item<double>());
  const double loss = host[0].item<double>() / samples;
  const double acc = host[1].item<double>() / samples;
  const double ranks = comm ? static_cast<double>(world.size) : 1.0;
  if (!std::isfinite(loss)) {
    throw diverged("training diverged: mean loss over steps {}–{} is {} (lr {:.4g}); the last good checkpoint in {} "
                   "is intact",
                   st.step - job.log.every_steps + 1, st.step, loss, lr, checkpoints->dir());
  }
  const double secs = st.interval_seconds;
  obs::TrainReading r{st.step, loss, acc, lr, secs > 0 ? samples / secs : 0};
  json record = {{"type", "train"},
                 {"step", st.step},
                 {"epoch", st.epoch},
                 {"loss", loss},
                 {"acc", acc},
                 {"lr", lr},
                 {"momentum", momentum},
                 {"samples_per_s", r.samples_per_s},
                 {"samples", st.samples}};
  if (job.train.clip_norm > 0) {
    record["grad_norm_max"] = host[3].item<double>() / ranks;           // before clipping
    record["grad_norm_max_clipped"] = host[4].item<double>() / ranks;   // what the optimizer saw
  }
  if (metrics != nullptr) metrics->write(record);
  progress.reading(r, st.epoch);
  loss_sum.zero_();
  correct.zero_();
  grad_norm_max.zero_();
  clipped_norm_max.zero_();
  st.interval_samples = 0;
  st.interval_seconds = 0;
}

TrainSummary Trainer::Impl::summarize(bool already_complete) {
  TrainSummary s;
  s.run_dir = run_dir;
  s.test_acc = st.last_test_acc;
  s.test_loss = st.last_test_loss;
  s.train_seconds = st.train_seconds;
  s.wall_seconds = seconds_since(wall_start);
  s.samples_per_s = st.step_seconds > 0 ? static_cast<double>(st.samples) / st.step_seconds : 0;
  s.steps = st.step;
  s.params_sha256 = params_sha256(model->module());
  s.already_complete = already_complete;
  s.precision = choice;
  const bool stepped = ran.logits_dtype != c10::ScalarType::Undefined;
  s.step_dtype = stepped ? c10::toString(ran.logits_dtype) : "";
  s.step_channels_last = ran.channels_last;
  s.loss_scale_tracker = scaler.growth_tracker();
  json timed = json::array();
  for (const auto& t : choice.timed) {
    timed.push_back({{"precision", t.precision},
                     {"memory_format", t.channels_last ? "channels_last" : "contiguous"},
                     {"ms", t.ms}});
  }
  json j = {{"test_acc", s.test_acc},
            {"test_loss", s.test_loss},
            {"train_seconds", s.train_seconds},
            {"step_seconds", st.step_seconds},
            {"eval_seconds", st.train_seconds - st.step_seconds},
            {"data_wait_seconds", st.data_wait_seconds},
            {"wall_seconds", s.wall_seconds},
            {"samples_per_s", s.samples_per_s},
            {"samples", st.samples},
            {"bad_samples_skipped", train_loader->skipped_count() + test_loader->skipped_count()},
            {"steps", st.step},
            {"epochs", job.train.epochs},
            {"precision", choice.precision},
            {"memory_format", choice.channels_last ? "channels_last" : "contiguous"},
            {"precision_source", choice.source},
            {"precision_timed", timed},
            {"step_dtype", stepped ? json(s.step_dtype) : json(nullptr)},
            {"step_channels_last", stepped ? json(s.step_channels_last) : json(nullptr)},
            {"skipped_steps", skipped_steps},
            {"oom_retries", oom_retries},
            {"loss_scale", scaler.enabled() ? json(scaler.scale()) : json(nullptr)},
            {"loss_scale_growth_tracker", scaler.enabled() ? json(scaler.growth_tracker()) : json(nullptr)},
            {"threads", compat::num_threads()},
            {"world_size", world.size},
            {"seed", job.run.seed},
            {"params_sha256", s.params_sha256},
            {"resumed_from_step", resumed_from ? json(*resumed_from) : json(nullptr)},
            {"torch_version", compat::torch_version()},
            {"crucible_version", CRUCIBLE_VERSION}};
  if (main_rank()) write_file_atomic((fs::path(run_dir) / "summary.json").string(), j.dump(2) + "\n");
  return s;
}

TrainSummary Trainer::Impl::run() {
  join_world();
  prepare_run_dir();
  std::string ckpt_path;
  std::optional<CheckpointData> ckpt;
  if (main_rank()) ckpt = checkpoints->load_latest(&ckpt_path);
  if (comm) {
    // Rank 0 chose the checkpoint (after any --restart cleanup); every rank resumes from it (X3).
    ckpt_path = comm->broadcast_string("resume", ckpt ? ckpt_path : std::string(), 0);
    if (!main_rank() && !ckpt_path.empty()) {
      try {
        ckpt = read_checkpoint(ckpt_path);
      } catch (const Error& e) {
        throw runtime_error("rank {} cannot read the checkpoint rank 0 resumes from (is {} shared between the "
                            "machines?): {}",
                            world.rank, checkpoints->dir(), e.what());
      }
    }
  }
  if (ckpt) take_stored_choices(*ckpt, ckpt_path);
  build();
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  if (ckpt) {
    restore(*ckpt, ckpt_path);
    resumed_from = st.step;
    log_info("resumed from {}: step {} (epoch {}, batch {} of {})", ckpt_path, st.step, st.epoch + 1,
             st.batch_in_epoch, steps_per_epoch);
    // Records past the checkpoint will be written again by this session.
    if (main_rank()) {
      obs::filter_jsonl(metrics_path, [&](const json& r) { return r.value("step", int64_t{0}) <= st.step; });
    }
  } else {
    if (flags.resume) throw bad_input("--resume: {} holds no checkpoint that verifies", checkpoints->dir());
    std::error_code ec;
    if (main_rank()) fs::remove(metrics_path, ec);
  }
  if (comm) {
    // Every replica starts from rank 0's weights, whatever its own initialisation or resume did.
    dist::broadcast_module(*comm, model->module(), 0);
  }
  const int64_t stop_step = job.train.max_steps > 0 ? std::min(job.train.max_steps, total_steps) : total_steps;
  if (st.step >= stop_step && st.last_eval_step == st.step) {
    log_info("run {} is already complete at step {} (test accuracy {:.2f}%); pass --restart to train it again",
             run_dir, st.step, 100 * st.last_test_acc);
    return summarize(/*already_complete=*/true);
  }

  // Law 4: rank 0 writes the metrics and draws progress (X6, X7).
  std::optional<obs::JsonlWriter> metrics_file;
  if (main_rank()) metrics_file.emplace(metrics_path);
  obs::JsonlWriter* metrics = metrics_file ? &*metrics_file : nullptr;
  obs::Progress progress(main_rank() ? obs::parse_progress_mode(job.log.progress, stdout_is_terminal())
                                     : obs::ProgressMode::kNone,
                         job.train.epochs, steps_per_epoch, total_steps);
  g_stop.store(false);
  Schedule::Point sp = schedule->at(st.step);

  while (st.step < stop_step && st.epoch < job.train.epochs) {
    train_loader->start_epoch(st.epoch, st.batch_in_epoch);
    while (st.step < stop_step) {
      const auto t_wait = Clock::now();
      std::optional<data::Batch> batch = train_loader->next();
      if (!batch) break;
      const auto t_step = Clock::now();
      st.data_wait_seconds += std::chrono::duration<double>(t_step - t_wait).count();

      sp = schedule->at(st.step);
      train_step(*batch, sp);
      ++st.step;
      ++st.batch_in_epoch;
      st.samples += batch->size() * world.size;  // global (exact unless the skip policy dropped samples)
      st.interval_samples += batch->size();
      const double dt = seconds_since(t_step) + std::chrono::duration<double>(t_step - t_wait).count();
      st.step_seconds += dt;
      st.train_seconds += dt;
      st.interval_seconds += dt;
      progress.step_done(st.step, st.epoch);

      if (st.step % job.log.every_steps == 0) {
        read_interval(metrics, progress, sp.lr, sp.momentum);
      }
      const bool epoch_end = st.batch_in_epoch == steps_per_epoch;
      if (comm ? stop_agreed : g_stop.load()) {
        progress.clear();
        save_checkpoint();
        throw runtime_error("interrupted at step {}: checkpoint written; run the same command again to resume",
                            st.step);
      }
      if (!epoch_end && st.step % job.checkpoint.every_steps == 0) save_checkpoint();
    }
    if (st.batch_in_epoch == steps_per_epoch) {
      progress.clear();
      evaluate(metrics);
      ++st.epoch;
      st.batch_in_epoch = 0;
      save_checkpoint();
      if (job.train.release_cache) compat::release_cached_memory(device);  // T13
    }
  }
  progress.clear();
  if (st.last_eval_step != st.step) {  // stopped by train.max_steps inside an epoch
    evaluate(metrics);
    save_checkpoint();
  }
  return summarize(/*already_complete=*/false);
}

Trainer::Trainer(JobConfig job, TrainFlags flags) : impl_(std::make_unique<Impl>(std::move(job), flags)) {}
Trainer::~Trainer() = default;

TrainSummary Trainer::run() { return impl_->run(); }
TrainSummary Trainer::evaluate_checkpoint(const std::string& path) { return impl_->evaluate_checkpoint(path); }

}  // namespace crucible::train
