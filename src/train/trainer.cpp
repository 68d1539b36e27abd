// Trainer: the loop (see trainer.h). What a step does is TrainStep's, evaluation is the
// Evaluator's, the checkpoint's contents are listed once in checkpoint_fields(), the folder is
// RunDir's and the metrics go to MetricSinks.
#include "crucible/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/sha256.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/device_input.h"
#include "crucible/data/loader.h"
#include "crucible/data/sampler.h"
#include "crucible/data/source.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/distributed/world.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/lint.h"
#include "crucible/nn/model.h"
#include "crucible/obs/jsonl.h"
#include "crucible/obs/metric_sink.h"
#include "crucible/obs/report.h"
#include "crucible/obs/tensorboard.h"
#include "crucible/train/breakdown.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/data_setup.h"
#include "crucible/train/doctor.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/fine_tune.h"
#include "crucible/train/grad_scaler.h"
#include "crucible/train/histogram.h"
#include "crucible/train/layer_profile.h"
#include "crucible/train/loss.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/phase_clock.h"
#include "crucible/train/predict.h"
#include "crucible/train/run_dir.h"
#include "crucible/train/run_state.h"
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

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

void request_stop() { g_stop.store(true); }

namespace testing {
void inject_oom(int64_t step, int64_t max_micro_batch) {
  g_oom_max.store(max_micro_batch);
  g_oom_step.store(step);
}
}  // namespace testing

RegisteredNames registered_names() {
  return {nn::model_registry().names(), loss_registry().names(), optimizer_registry().names()};
}

std::string params_sha256(nn::Model& model) {
  Sha256 h;
  auto add = [&h](const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();  // outside the step: the end-of-run digest
    h.update(fmt::format("{}:{}:{}:{}\n", name.size(), name, c10::toString(c.scalar_type()), fmt::join(c.sizes(), ",")));
    h.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  };
  for (const auto& p : model.named_parameters()) add(p.name, p.tensor);
  for (const auto& b : model.named_buffers()) add(b.name, b.tensor);
  return h.hex_digest();
}

namespace {

// A model that can be written as TorchScript (a user model from Python) is, at the end of
// training, written back to its run folder: model.ts.pt (torch.jit.load) and model.safetensors
// (plain state_dict names). Rank 0 only (law 4).
void export_model(nn::Model& model, const std::string& run_dir) {
  const std::string ts = run_dir + "/model.ts.pt", st = run_dir + "/model.safetensors";
  if (!model.save_torchscript(ts)) return;
  std::vector<at::Tensor> keep;
  std::vector<nn::NamedTensor> all = model.named_parameters();
  for (auto& b : model.named_buffers()) all.push_back(std::move(b));
  keep.resize(all.size());
  std::vector<io::TensorBytes> bytes;
  for (size_t i = 0; i < all.size(); ++i) {
    // outside the step: the end-of-run export
    bytes.push_back(io::tensor_bytes(all[i].name, all[i].tensor.detach().to(at::kCPU), keep[i]));
  }
  io::write_safetensors(st, bytes, {});
  log_info("trained model → {} (TorchScript) and {} (safetensors, state_dict names)", ts, st);
}

}  // namespace

struct Trainer::Impl {
  JobConfig job;
  TrainFlags flags;
  Clock::time_point wall_start = Clock::now();

  std::unique_ptr<RunDir> dir;
  std::unique_ptr<data::Loader> train_loader, test_loader;
  std::unique_ptr<data::DeviceInput> input;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Schedule> schedule;
  std::unique_ptr<TrainStep> step;
  std::unique_ptr<Evaluator> evaluator;
  GradScaler scaler;
  c10::Device device{c10::kCPU};
  int64_t steps_per_epoch = 0, total_steps = 0;
  RunState st;
  std::optional<int64_t> resumed_from;
  // T6: host reads counted when this session's training loop started, and its first step.
  std::array<int64_t, kHostReadReasons> host_reads_at_start{};
  int64_t first_step = 0;
  std::vector<NamedTensor> params;  // what the optimizer updates, in the model's order
  PrecisionChoice choice;           // as configured, resumed, or timed ("auto")
  std::unique_ptr<FILE, int (*)(FILE*)> step_trace{nullptr, &std::fclose};  // test seam (M4)
  bool from_checkpoint = false;               // weights come from a checkpoint (resume, eval): no model.init
  std::optional<Precision> stored_precision;  // the choice a resumed run made
  std::optional<nn::InputSpec> stored_input;  // the input a checkpoint's model was trained on
  std::string stored_input_source;
  nn::InputSpec model_input;                  // what the model takes (saved in checkpoints)
  std::string determinism_env;  // what set_deterministic did to the environment (for the log)
  // Data parallel (law 7): one process per device; null comm = a single process.
  distributed::World world;
  std::unique_ptr<distributed::Comm> comm;
  std::unique_ptr<distributed::GradSync> grad_sync;
  nn::LocalCollective local_collective;  // dist.bn = sync in a single process
  std::vector<int64_t> scales;           // M4: train.multi_scale sizes (empty = off)
  // The step-time breakdown (train.profile): the clock, this session's phases and measured step
  // time, the current step's start, and the loader's busy time and wall clock at the interval's
  // start (its busy share for the verdict).
  std::unique_ptr<PhaseClock> clock;
  std::unique_ptr<LayerProfiler> layer_profiler;  // train.profile = "full"
  PhaseSeconds session_phases;
  double session_step_seconds = 0;
  Clock::time_point step_begin;
  int loader_threads = 1;
  double interval_loader_busy = 0, session_loader_busy = 0;
  std::string doctor_json;           // run_doctor_quick's checks at start (summary.json "doctor")
  bool cpu_bf16 = false;             // this CPU computes bf16 in hardware (cpu_bf16_flag says why)
  std::string cpu_bf16_flag;
  bool main_rank() const { return world.rank == 0; }

  Impl(JobConfig j, TrainFlags f) : job(std::move(j)), flags(f) {}

  void join_world();
  void sync_bn_buffers();
  void verify_replicas();
  void build();
  void checkpoint_fields(CheckpointIO& io);
  void save_checkpoint();
  void evaluate(obs::MetricSinks& sinks);
  void train_step(const data::Batch& batch, const Schedule::Point& sp, bool* stop);
  void choose_precision(const data::SamplePipeline& pipeline, const data::ImageSpec& spec, int64_t classes);
  void read_interval(obs::MetricSinks& sinks, double lr, double momentum);
  void write_report();
  void count_step_time();
  std::array<int64_t, kHostReadReasons> session_host_reads() const;  // T6: since the loop began, by reason
  BottleneckContext bottleneck_context(double loader_busy_seconds, double step_seconds) const;
  TrainSummary summarize(bool already_complete);
  TrainSummary run();
  TrainSummary evaluate_checkpoint(std::string path);
  void take_stored_choices(const CheckpointData& ckpt, const std::string& path);
  bool newest_checkpoint(std::string* path);
  std::string no_checkpoint_reason() const;
  std::string load_predict_model(std::string checkpoint);
  PredictSummary predict(const PredictOptions& options);
};

// Joins the data-parallel job this process was started in (crucible launch, torchrun, SLURM
// through their variables), if any: device from LOCAL_RANK before any collective (T2), then
// the rendezvous and the process group.
void Trainer::Impl::join_world() {
  world = distributed::world_from_env();
  set_log_rank(world.rank);
  // Before anything touches CUDA (resolve_device below counts the GPUs): the driver reads
  // CUDA_LAUNCH_BLOCKING when it starts (T14) and cuBLAS reads CUBLAS_WORKSPACE_CONFIG when its
  // first handle is made (M6); set later, both silently do nothing.
  if (job.train.sync_debug) compat::enable_sync_debug();
  determinism_env = compat::set_deterministic(job.train.deterministic);
  device = compat::resolve_device(job.train.device);
  if (!world.launched) return;
  if (device.is_cuda()) {
    distributed::check_devices(world, compat::cuda_device_count());
    device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(world.local_rank));
    compat::bind_device(device);
  }
  distributed::CommOptions co;
  co.backend = job.dist.backend;
  co.timeout_s = job.dist.timeout_s;
  const auto t0 = Clock::now();
  comm = distributed::Comm::connect(world, device, co);
  log_info("data parallel: {} processes, {} backend, device {} per process from LOCAL_RANK, timeout {:.0f} s; "
           "joined in {:.1f} s",
           world.size, comm->backend(), device.str(), job.dist.timeout_s, seconds_since(t0));
}

// M2: running statistics equal on every rank before anything reads them.
void Trainer::Impl::sync_bn_buffers() {
  if (comm && job.dist.bn != DistSection::Bn::kSync) distributed::sync_buffers(*comm, *model, bn_name(job.dist.bn));
}

// The replicas must hold the same weights; a cheap fingerprint per rank is compared at every
// checkpoint so a divergence is caught where it starts, not in a worse model.
void Trainer::Impl::verify_replicas() {
  if (!comm) return;
  at::NoGradGuard no_grad;
  at::Tensor fp = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& p : params) {
    const at::Tensor d = p.tensor.detach().to(at::kDouble);
    fp[0] += d.sum();
    fp[1] += d.abs().sum();
  }
  const std::vector<double> all = host_values(comm->all_gather(fp), HostRead::kReplicas);  // [rank][2]
  for (size_t r = 1; r < static_cast<size_t>(world.size); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      throw runtime_error("step {}: rank {} holds different weights from rank 0 (fingerprints {:.17g}/{:.17g} vs "
                          "{:.17g}/{:.17g}); the replicas diverged",
                          st.step, r, all[2 * r], all[2 * r + 1], all[0], all[1]);
    }
  }
}

void Trainer::Impl::build() {
  const uint64_t seed = static_cast<uint64_t>(job.run.seed);
  // Compute threads: this machine's cores shared by its processes.
  const int threads = compute_threads(job, world.local_size);
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
  const bool multi_label = ds.train->target_width() > 0;
  log_info("data: {} training and {} test samples of {} ({} classes{}), opened in {:.1f} s", ds.train->size(),
           ds.test->size(), spec.to_string(), ds.num_classes, multi_label ? ", multi-label" : "", seconds_since(t0));
  log_info("train pipeline: {}", ds.train->describe());

  const data::NormalizeOptions norm = normalize_options(job);
  loader_threads = static_cast<int>(job.data.threads);
  std::string chosen;
  if (loader_threads == 0) {
    // D10: in-RAM arrays need little; decoded images get the count measured fastest.
    const int cores = std::max(1, available_cores() / std::max(1, world.local_size));
    loader_threads = job.data.dataset != DataSection::Dataset::kImages ? std::max(1, threads / 2)
                                               : data::choose_loader_threads(*ds.train, cores, &chosen);
  }
  data::LoaderOptions train_options = loader_options(job, job.train.batch_size, loader_threads);
  data::LoaderOptions test_options = loader_options(job, job.train.eval_batch_size, loader_threads);
  train_options.allocate = test_options.allocate = data::DeviceInput::batch_allocator(device);  // D9
  if (const char* ms = std::getenv(testing::kSampleDelayEnv); ms != nullptr && *ms != '\0') {
    train_options.sample_delay = std::chrono::microseconds(static_cast<int64_t>(1000 * std::atof(ms)));
    log_warn("{}={}: every training sample takes {} ms longer to load (test seam)", testing::kSampleDelayEnv, ms, ms);
  }
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
  if (!job.model.init.empty() && !from_checkpoint) {
    // Fine-tuning: the file's weights by name; a head of another class count keeps its fresh init.
    const InitReport r = load_initial_weights(*model, job.model, classes);
    for (const auto& n : r.notes) log_info("model.init: {} (X4)", n);
    log_info("model.init: {} tensors from {}{}", r.loaded, job.model.init,
             r.ignored.empty() ? "" : fmt::format("; not loaded (model.init_ignore): {}", fmt::join(r.ignored, ", ")));
    for (const auto& h : r.reinitialised) {
      log_info("model.init: classifier head {} re-initialised for the data's {} classes", h, classes);
    }
  }
  model->to(device);
  model->train(true);
  compat::seed_cpu_generator(derive_seed(seed, RngStream::kDropout));
  compat::seed_device_generator(device, derive_seed(seed, RngStream::kDropout));
  log_info("model: {}, {} parameters", model->describe(), nn::parameter_count(*model));
  if (model->nn_module() != nullptr) {
    for (const auto& w : nn::lint_bias_before_norm(*model->nn_module())) log_warn("model lint (M7): {}", w);
  }
  loss = make_loss({job.loss, classes, device, multi_label});
  log_info("loss: {}", loss->describe());

  // Precision and memory format: as configured, as a resumed run chose, or auto (a rule on a
  // CPU, timed on a GPU).
  cpu_bf16 = cpu_has_native_bf16(&cpu_bf16_flag);
  if (main_rank()) {
    const DoctorReport quick = run_doctor_quick(job, world.local_size);
    for (const auto& c : quick.checks) {
      if (c.status != DoctorCheck::Status::kOk) {
        log_warn("doctor: {}: {}{}", c.name, c.found, c.fix.empty() ? "" : " → " + c.fix);
      }
    }
    doctor_json = doctor_checks_json(quick);
  }
  if (stored_precision) {
    choice.value = *stored_precision;
    choice.source = "checkpoint";
  } else if (job.train.precision == PrecisionMode::kAuto && !device.is_cuda()) {
    // A CPU: by rule (cpu_auto_precision), the same on every rank of the machine and every run.
    choice.source = "auto";
    choice.value = cpu_auto_precision(cpu_bf16, job.train.channels_last);
    log_info("precision auto: {} → {}", cpu_bf16 ? fmt::format("this CPU computes bf16 in hardware ({})", cpu_bf16_flag)
                                               : std::string("this CPU has no bf16 arithmetic (no avx512_bf16, amx_bf16 "
                                                             "or bf16 in /proc/cpuinfo): bf16 would be emulated, "
                                                             "several times slower than fp32"),
             choice.value.to_string());
    if (comm) {
      choice.value = Precision::parse(comm->broadcast_string("precision", choice.value.to_string(), 0),
                                      "rank 0's precision choice");
    }
  } else if (job.train.precision == PrecisionMode::kAuto) {
    // A GPU: timed on rank 0 alone; every rank takes its choice (replicas must compute alike).
    choice.source = "auto";
    if (main_rank()) choose_precision(*ds.train, spec, classes);
    if (comm) {
      choice.value = Precision::parse(comm->broadcast_string("precision", choice.value.to_string(), 0),
                                      "rank 0's precision choice");
    }
  } else {
    choice.value = configured_precision(job.train.precision, job.train.channels_last);
    choice.source = "configured";
    if (main_rank() && choice.value.dtype == ComputeDtype::kBf16 && !device.is_cuda() && !cpu_bf16) {
      log_warn("train.precision = \"bf16\" on a CPU without bf16 arithmetic (no avx512_bf16, amx_bf16 or bf16 in "
               "/proc/cpuinfo): autocast emulates it, several times slower than fp32 (`crucible doctor` measures "
               "it); set train.precision = \"auto\" (fp32 here) or \"fp32\"");
    }
  }
  const Precision& precision = choice.value;
  if (precision.channels_last) nn::to_channels_last(*model);
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
  input = std::make_unique<data::DeviceInput>(spec, norm, device, precision.channels_last);
  // Law 3: the input the model takes — as built, or as trained (a checkpoint's) — against what
  // the pipeline delivers; a model trained here keeps the pipeline's convention from now on.
  const nn::InputSpec expected = stored_input ? *stored_input : model->input_spec();
  nn::check_input(expected, input->delivers(),
                  stored_input ? "the model in " + stored_input_source : "model " + job.model.name);
  model_input = expected.order ? expected : expected.trained_on(input->delivers());
  log_info("input: {}; loader: {}, prefetch {}, bad samples: {}", input->describe(),
           chosen.empty() ? fmt::format("{} thread(s)", loader_threads) : chosen, job.data.prefetch,
           data::bad_sample_policy_name(job.data.bad_samples));
  if (precision.mixed() && !compat::autocast_supported(device.type(), autocast_dtype(precision))) {
    throw bad_input("train.precision = \"{}\": libtorch {} has no {} autocast on {}; use \"bf16\" or \"fp32\"",
                    precision.dtype_name(), compat::torch_version(), precision.dtype_name(), device.str());
  }
  scaler = GradScaler(grad_scaler_options(job, precision));
  log_info("precision: {}{}, memory format {}{}", precision.dtype_name(),
           precision.mixed() ? " (autocast mixed precision)" : "", precision.memory_format_name(),
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
  std::vector<std::string> frozen;
  params = trainable_parameters(*model, job.model.freeze, &frozen);
  if (!frozen.empty()) {
    log_info("model.freeze: {} parameter tensor(s) kept fixed, not optimised nor synced: {}", frozen.size(),
             fmt::join(frozen, ", "));
  }
  std::vector<ParamGroup> groups = parameter_groups(job.optim, params);
  log_info("parameter groups (T4): {} tensors with weight decay {}, {} biases/norm weights with {}",
           groups[0].params.size(), groups[0].weight_decay, groups[1].params.size(), groups[1].weight_decay);
  optimizer = make_optimizer(job.optim, std::move(groups));
  if (!comm && job.dist.bn == DistSection::Bn::kSync) {
    // One process computes what N processes compute: the same SyncBatchNorm numerics (statistics
    // combined in double), so a run can be compared across world sizes. torch's CPU kernel
    // accumulates channels_last statistics in float (relative error ~4e-4 measured at batch 256).
    const int n = nn::convert_sync_batchnorm(nn::require_nn_module(*model, "dist.bn = sync"), &local_collective);
    log_info("dist.bn = sync in one process: {} BatchNorm layer(s) use the SyncBatchNorm computation", n);
  }
  if (comm) {
    // M3: SyncBatchNorm before gradient sync is set up; then DDP's reducer (M5, T11).
    if (job.dist.bn == DistSection::Bn::kSync) {
      const int n = nn::convert_sync_batchnorm(nn::require_nn_module(*model, "dist.bn = sync"), comm.get());
      log_info("dist.bn = sync: {} BatchNorm layer(s) take statistics over all {} ranks (M3)", n, world.size);
    } else {
      log_info("dist.bn = {}: BatchNorm statistics per rank, made equal ({}) before evaluation and checkpoints (M2)",
               bn_name(job.dist.bn), job.dist.bn == DistSection::Bn::kBroadcast ? "rank 0's" : "averaged");
    }
    std::vector<at::Tensor> tensors;
    for (const auto& p : params) tensors.push_back(p.tensor);
    grad_sync = std::make_unique<distributed::GradSync>(*comm, tensors, job.dist.bucket_mb);
    if (const char* ms = std::getenv(testing::kAllReduceDelayEnv); ms != nullptr && *ms != '\0') {
      grad_sync->set_test_delay(std::chrono::microseconds(static_cast<int64_t>(1000 * std::atof(ms))));
      log_warn("{}={}: every gradient sync takes {} ms longer (test seam)", testing::kAllReduceDelayEnv, ms, ms);
    }
    log_info("gradient sync: {}, all-reduced during backward", grad_sync->describe());
  }
  const int64_t global_batch = job.train.batch_size * world.size;
  const double lr = job.optim.lr_per_256 > 0 ? job.optim.lr_per_256 * static_cast<double>(global_batch) / 256.0
                                             : job.optim.lr;
  if (job.optim.lr_per_256 > 0) {
    log_info("lr = {} per 256 samples × global batch {}{} / 256 = {} (T7)", job.optim.lr_per_256, global_batch,
             comm ? fmt::format(" ({} ranks × {})", world.size, job.train.batch_size) : "", lr);
  }
  schedule = std::make_unique<Schedule>(job.schedule, lr, optimizer_momentum(job.optim), total_steps);
  log_info("optimizer: {}; schedule: {}", optimizer->describe(), schedule->describe());
  log_info("training: {} epochs × {} steps of batch {}{}{} = {} steps; checkpoint every {} steps, keep {}",
           job.train.epochs, steps_per_epoch, job.train.batch_size,
           comm ? fmt::format(" per rank × {} ranks = {}", world.size, global_batch) : std::string(),
           job.train.accumulate > 1 ? fmt::format(" ({} micro-batches)", job.train.accumulate) : "", total_steps,
           job.checkpoint.every_steps, job.checkpoint.keep);

  TrainStepOptions so;
  so.precision = precision;
  so.accumulate = job.train.accumulate;
  so.clip_norm = job.train.clip_norm;
  so.max_bad_steps = job.train.max_bad_steps;
  so.checkpoint_dir = dir ? dir->checkpoints().dir() : std::string();
  step = std::make_unique<TrainStep>(*model, *loss, *optimizer, scaler, params, so, device, comm.get(),
                                     grad_sync.get());
  clock = std::make_unique<PhaseClock>(device, job.train.profile != TrainSection::Profile::kOff);
  step->set_clock(clock.get());
  if (job.train.profile == TrainSection::Profile::kFull) {
    if (model->nn_module() == nullptr) {
      log_warn("train.profile = \"full\": {} marks no layers; per-layer times cover the zoo's models only (the "
               "step-time breakdown is kept)",
               job.model.name);
    } else {
      layer_profiler = std::make_unique<LayerProfiler>(device);
    }
  }
  step->before_forward = [this](int64_t samples) {
    if (g_oom_step.load() == st.step && samples > g_oom_max.load()) throw SimulatedOom();
  };
  evaluator = std::make_unique<Evaluator>(*model, *test_loader, *input, *loss, precision, device, comm.get());
}

// The checkpoint's contents, listed once: written by save_checkpoint, read back on resume.
void Trainer::Impl::checkpoint_fields(CheckpointIO& io) {
  io.model("model.", *model);
  io.tensor_list("optim.", [this] { return optimizer->state(); },
                 [this](const std::vector<NamedTensor>& s) { optimizer->load_state(s); });
  io.tensor_via("rng.torch_cpu", [] { return compat::cpu_generator_state(); },
                [](const at::Tensor& t) { compat::set_cpu_generator_state(t); });
  if (device.is_cuda()) {  // its dropout
    const bool found = io.tensor_via("rng.torch_cuda", [this] { return compat::generator_state(device); },
                                     [this](const at::Tensor& t) { compat::set_generator_state(device, t); },
                                     /*required=*/false);
    if (!found) {
      log_warn("{}: no GPU generator state (saved by a CPU run, or before it was kept): dropout on {} draws "
               "from a fresh stream, so this resume is not bit-exact",
               io.path(), device.str());
    }
  }
  IntervalSums& sums = step->sums();
  io.tensor("metrics.loss_sum", sums.loss_sum);
  io.tensor("metrics.correct", sums.correct);
  if (io.reading()) sums.grad_norm_max.zero_(), sums.clipped_norm_max.zero_();  // absent before issue 10
  io.tensor("metrics.grad_norm_max", sums.grad_norm_max, /*required=*/false);
  io.tensor("metrics.clipped_norm_max", sums.clipped_norm_max, /*required=*/false);
  io.state(st);
  int64_t saved_total = total_steps;
  io.value("total_steps", saved_total);
  if (io.reading() && saved_total != total_steps) {
    throw bad_input("{}: checkpoint was written for {} total steps, this job has {}", io.path(), saved_total,
                    total_steps);
  }
  io.note("precision", choice.value.dtype_name());
  io.note("memory_format", choice.value.memory_format_name());
  io.note("model_input", model_input.to_json());  // law 3 (read before build: take_stored_choices)
  StepCounters& c = step->counters();
  if (io.reading()) {
    scaler.restore(*io.input(), io.path());  // T1
  } else {
    scaler.save(*io.output());
  }
  io.value("skipped_steps", c.skipped_steps);
  io.value("bad_in_row", c.bad_in_row);
  io.value("oom_retries", c.oom_retries);
  io.note("config", resolved_toml(job));
  io.note("crucible_version", CRUCIBLE_VERSION);
  io.note("torch_version", compat::torch_version());
}

// A resumed or evaluated run keeps the precision and memory format it chose (auto may time
// differently now) and the input convention its model was trained on (law 3).
void Trainer::Impl::take_stored_choices(const CheckpointData& ckpt, const std::string& path) {
  auto p = ckpt.meta.find("precision");
  auto f = ckpt.meta.find("memory_format");
  if (p != ckpt.meta.end() && f != ckpt.meta.end()) stored_precision = Precision::from_fields(p->second, f->second, path);
  if (auto in = ckpt.meta.find("model_input"); in != ckpt.meta.end()) {
    stored_input = nn::InputSpec::from_json(in->second, path);
    stored_input_source = path;
  }
}

void Trainer::Impl::save_checkpoint() {
  const auto t0 = Clock::now();
  sync_bn_buffers();
  verify_replicas();
  if (!main_rank()) return;  // law 4: rank 0 writes; the replicas are equal
  CheckpointData data;
  CheckpointIO io = CheckpointIO::writer(data);
  checkpoint_fields(io);
  const std::string path = dir->checkpoints().save(st.step, data);
  const double secs = seconds_since(t0);
  st.train_seconds += secs;  // part of training time, though written before it is counted
  log_info("checkpoint step {} → {} ({:.2f} s)", st.step, path, secs);
  write_report();
}

// <run>/report.html from the run folder's files (rank 0): derived, so a failure to write it is
// a warning, not the end of a run.
void Trainer::Impl::write_report() {
  if (!main_rank() || flags.report_defaults_toml.empty()) return;
  try {
    obs::write_run_report(dir->path(), flags.report_defaults_toml);
  } catch (const std::exception& e) {
    log_warn("{}/report.html not written: {}", dir->path(), e.what());
  }
}

void Trainer::Impl::evaluate(obs::MetricSinks& sinks) {
  const auto t0 = Clock::now();
  sync_bn_buffers();  // M2: every rank evaluates with the same statistics
  const EvalResult r = evaluator->run();
  st.last_test_loss = r.loss;
  st.last_test_acc = r.acc;
  st.last_test_top5 = r.top5;
  st.last_eval_step = st.step;
  const double secs = seconds_since(t0);
  st.train_seconds += secs;
  sinks.write({{"type", "eval"},
               {"step", st.step},
               {"epoch", st.epoch + (st.batch_in_epoch == steps_per_epoch ? 1 : 0)},
               {"test_loss", st.last_test_loss},
               {"test_acc", st.last_test_acc},
               {"test_top5", st.last_test_top5},
               {"samples", r.samples},
               {"seconds", secs},
               {"train_seconds", st.train_seconds}});
  log_info("eval after step {}: test accuracy {:.2f}% (top-5 {:.2f}%), loss {:.4f} ({} samples{}, {:.1f} s)", st.step,
           100 * st.last_test_acc, 100 * st.last_test_top5, st.last_test_loss, r.samples,
           comm ? fmt::format(" over {} ranks", world.size) : std::string(), secs);
}

// precision = "auto": times one whole training step (TrialStep: the step that trains) of each
// safe candidate on a scratch copy of the model and one real batch, picks the fastest and says
// why. The scratch model is initialised from a saved generator state, so the run's own random
// streams are untouched.
void Trainer::Impl::choose_precision(const data::SamplePipeline& pipeline, const data::ImageSpec& spec,
                                     int64_t classes) {
  const at::Tensor rng_state = compat::cpu_generator_state();
  const at::Tensor device_rng_state = device.is_cuda() ? compat::generator_state(device) : at::Tensor();
  const int64_t n = std::min<int64_t>(job.train.batch_size, pipeline.size());
  const data::Batch batch = data::sample_batch(pipeline, n);
  std::vector<PrecisionTiming> candidates = {{{ComputeDtype::kFp32, false}}, {{ComputeDtype::kFp32, true}}};
  if (compat::autocast_supported(device.type(), c10::ScalarType::BFloat16)) {
    candidates.push_back({{ComputeDtype::kBf16, false}});
    candidates.push_back({{ComputeDtype::kBf16, true}});
  }
  const data::NormalizeOptions norm = normalize_options(job);
  for (auto& c : candidates) {
    TrialStep trial(job, spec.channels, spec.height, spec.width, classes, c.precision, device);
    data::DeviceInput in(spec, norm, device, c.precision.channels_last);
    const at::Tensor x = in.images(batch), y = in.labels(batch);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      trial.run(x, y);  // ends in a host read: the clock measures the work
      if (rep >= 1) best = std::min(best, seconds_since(t0) * 1000.0);  // the first is warm-up
    }
    c.ms = best;
  }
  compat::set_cpu_generator_state(rng_state);
  if (device_rng_state.defined()) compat::set_generator_state(device, device_rng_state);
  const PrecisionTiming* pick = &candidates[0];
  std::string table;
  for (const auto& c : candidates) {
    table += fmt::format("{}{} {:.1f} ms", table.empty() ? "" : ", ", c.precision.to_string(), c.ms);
    if (c.ms < pick->ms) pick = &c;
  }
  choice.timed = candidates;
  choice.value = pick->precision;
  log_info("precision auto: a training step on a batch of {}: {} → {} (the fastest; fp16 is not a candidate: it "
           "needs a loss scaler and has no CPU autocast in every libtorch)",
           n, table, choice.value.to_string());
}

// One optimizer step on `batch`, at this step's size (M4).
void Trainer::Impl::train_step(const data::Batch& batch, const Schedule::Point& sp, bool* stop) {
  at::Tensor x = input->images(batch);
  const at::Tensor y = input->labels(batch);
  if (!scales.empty()) {
    // M4: this step's size, the same on every rank (a function of seed and step).
    const int64_t size = multi_scale_size(static_cast<uint64_t>(job.run.seed), st.step, scales);
    if (size != x.size(2) || size != x.size(3)) {
      x = at::upsample_bilinear2d(x, {size, size}, /*align_corners=*/false);
    }
  }
  clock->lap(Phase::kTransfer);
  if (step_trace) {
    std::fprintf(step_trace.get(), "%lld %lld\n", static_cast<long long>(st.step), static_cast<long long>(x.size(2)));
  }
  const TrainStep::Result r = step->run(x, y, st.step, sp.lr, sp.momentum, g_stop.load(), batch.sample_ids);
  if (comm) *stop = r.stop_agreed;  // every rank stops at the same step (SIGINT on any rank)
}

void Trainer::Impl::read_interval(obs::MetricSinks& sinks, double lr, double momentum) {
  // The one host read of the interval (law 2); under data parallel the sums of every rank.
  // Gradient norms are of the averaged gradients, equal on every rank: the sum over ranks / N.
  IntervalSums& sums = step->sums();
  at::Tensor all = at::stack({sums.loss_sum.to(at::kDouble), sums.correct.to(at::kDouble),
                              at::scalar_tensor(static_cast<double>(st.interval_samples),
                                                at::TensorOptions().dtype(at::kDouble).device(device)),
                              sums.grad_norm_max.to(at::kDouble), sums.clipped_norm_max.to(at::kDouble)});
  if (comm) comm->all_reduce_sum(all);
  const std::vector<double> host = host_values(all, HostRead::kInterval);
  const double samples = std::max(1.0, host[2]);
  const double loss_mean = host[0] / samples;
  const double acc = host[1] / samples;
  const double ranks = comm ? static_cast<double>(world.size) : 1.0;
  if (!std::isfinite(loss_mean)) {
    throw diverged("training diverged: mean loss over steps {}–{} is {} (lr {:.4g}); the last good checkpoint in {} "
                   "is intact",
                   st.step - job.log.every_steps + 1, st.step, loss_mean, lr, dir->checkpoints().dir());
  }
  if (comm) clock->lap(Phase::kCommunication);  // the all-reduce above (Gloo waits in it)
  clock->lap(Phase::kHostSync);
  count_step_time();
  const double secs = st.interval_seconds;
  json record = {{"type", "train"},
                 {"step", st.step},
                 {"epoch", st.epoch},
                 {"loss", loss_mean},
                 {"acc", acc},
                 {"lr", lr},
                 {"momentum", momentum},
                 {"samples_per_s", secs > 0 ? samples / secs : 0},
                 {"samples", st.samples}};
  if (job.train.clip_norm > 0) {
    record["grad_norm_max"] = host[3] / ranks;           // before clipping
    record["grad_norm_max_clipped"] = host[4] / ranks;   // what the optimizer saw
  }
  if (clock->enabled()) {
    // The breakdown: each phase's share of the interval's measured step time (they add up to
    // it within clock jitter on CPU; on CUDA the device timeline is measured against the host's).
    const PhaseSeconds phases = clock->take();
    session_phases += phases;
    json shares = json::object();
    for (int i = 0; i < kPhases; ++i) {
      const auto p = static_cast<Phase>(i);
      shares[phase_name(p)] = secs > 0 ? phases[p] / secs : 0.0;
    }
    record["step_seconds"] = secs;
    record["breakdown"] = shares;
    const double busy = train_loader->busy_seconds();
    const Bottleneck b = diagnose(phases, bottleneck_context(busy - interval_loader_busy, secs));
    interval_loader_busy = busy;
    record["verdict"] = b.verdict();
    record["verdict_share"] = b.share;
  }
  sinks.write(record);
  sums.zero();
  st.interval_samples = 0;
  st.interval_seconds = 0;
}

// The step's time since it began (or since the last count), into the run's step time.
void Trainer::Impl::count_step_time() {
  const auto now = Clock::now();
  const double dt = std::chrono::duration<double>(now - step_begin).count();
  step_begin = now;
  st.step_seconds += dt;
  st.train_seconds += dt;
  st.interval_seconds += dt;
  session_step_seconds += dt;
}

std::array<int64_t, kHostReadReasons> Trainer::Impl::session_host_reads() const {
  auto n = host_read_counts();
  for (size_t i = 0; i < n.size(); ++i) n[i] -= host_reads_at_start[i];
  return n;
}

BottleneckContext Trainer::Impl::bottleneck_context(double loader_busy_seconds, double step_seconds) const {
  BottleneckContext c;
  c.dataset = job.data.dataset == DataSection::Dataset::kIdx      ? "idx"
              : job.data.dataset == DataSection::Dataset::kArrays ? "arrays"
                                                                  : "images";
  c.loader_threads = loader_threads;
  c.loader_busy = step_seconds > 0 ? loader_busy_seconds / (loader_threads * step_seconds) : -1;
  c.prefetch = job.data.prefetch;
  c.cache = data::cache_mode_name(job.data.cache);
  const data::SamplePipeline& train = train_loader->pipeline();
  c.decoded_cache_gb = static_cast<double>(train.size()) * static_cast<double>(train.output_spec().bytes()) / 1e9;
  c.free_memory_gb = static_cast<double>(available_memory_bytes()) / 1e9;
  c.cores = std::max(1, available_cores() / std::max(1, world.local_size));
  c.compute_threads = compat::num_threads();
  c.cuda = device.is_cuda();
  c.precision = choice.value.dtype_name();
  c.native_bf16 = device.is_cuda() || cpu_bf16;
  c.channels_last = choice.value.channels_last;
  c.batch_size = job.train.batch_size;
  c.world_size = world.size;
  c.bucket_mb = job.dist.bucket_mb;
  c.accumulate = job.train.accumulate;
  int64_t reads = 0;
  for (int64_t n : session_host_reads()) reads += n;
  c.host_reads_per_step = st.step > first_step ? static_cast<double>(reads) / static_cast<double>(st.step - first_step) : 1;
  c.log_every_steps = job.log.every_steps;
  c.sync_debug = job.train.sync_debug;
  return c;
}

TrainSummary Trainer::Impl::summarize(bool already_complete) {
  TrainSummary s;
  s.run_dir = dir->path();
  s.test_acc = st.last_test_acc;
  s.test_top5 = st.last_test_top5;
  s.test_loss = st.last_test_loss;
  s.train_seconds = st.train_seconds;
  s.wall_seconds = seconds_since(wall_start);
  s.samples_per_s = st.step_seconds > 0 ? static_cast<double>(st.samples) / st.step_seconds : 0;
  s.steps = st.step;
  s.params_sha256 = params_sha256(*model);
  s.already_complete = already_complete;
  s.precision = choice;
  const MicroBatchRecord& ran = step->ran();
  const bool stepped = ran.logits_dtype != c10::ScalarType::Undefined;
  s.step_dtype = stepped ? c10::toString(ran.logits_dtype) : "";
  s.step_channels_last = ran.channels_last;
  s.loss_scale_tracker = scaler.growth_tracker();
  json timed = json::array();
  for (const auto& t : choice.timed) {
    timed.push_back({{"precision", t.precision.dtype_name()},
                     {"memory_format", t.precision.memory_format_name()},
                     {"ms", t.ms}});
  }
  const StepCounters& c = step->counters();
  // T6: this session's host reads in the training loop, by reason, and per step.
  json host_reads = json::object();
  int64_t reads = 0;
  const auto session = session_host_reads();
  for (int i = 0; i < kHostReadReasons; ++i) {
    const int64_t n = session[static_cast<size_t>(i)];
    host_reads[host_read_name(static_cast<HostRead>(i))] = n;
    reads += n;
  }
  const int64_t session_steps = st.step - first_step;
  json breakdown = nullptr, bottleneck = nullptr;
  if (clock) session_phases += clock->take();  // the steps after the last log interval
  if (clock && clock->enabled() && session_steps > 0 && session_step_seconds > 0) {
    // This session's steps (a resumed run's earlier sessions are in metrics.jsonl).
    json phases = json::object(), shares = json::object();
    for (int i = 0; i < kPhases; ++i) {
      const auto p = static_cast<Phase>(i);
      phases[phase_name(p)] = session_phases[p];
      shares[phase_name(p)] = session_phases[p] / session_step_seconds;
    }
    breakdown = {{"step_seconds", session_step_seconds},
                 {"phases", phases},
                 {"shares", shares},
                 {"checkpoint_eval_seconds", st.train_seconds - st.step_seconds},
                 {"steps", session_steps}};
    const Bottleneck b = diagnose(session_phases, bottleneck_context(session_loader_busy, session_step_seconds));
    bottleneck = {{"verdict", b.verdict()}, {"share", b.share}, {"evidence", b.evidence}, {"fix", b.fix}};
  }
  // train.profile = "full": each layer's forward and backward, per step of this session.
  json layers = nullptr;
  if (layer_profiler && session_steps > 0) {
    layers = json::array();
    for (const LayerTime& l : layer_profiler->layers()) {
      layers.push_back({{"name", l.name},
                        {"forward_seconds", l.forward_seconds},
                        {"backward_seconds", l.backward_seconds},
                        {"forward_ms_per_step", 1e3 * l.forward_seconds / session_steps},
                        {"backward_ms_per_step", 1e3 * l.backward_seconds / session_steps},
                        {"share", session_step_seconds > 0
                                      ? (l.forward_seconds + l.backward_seconds) / session_step_seconds
                                      : 0.0}});
    }
    if (main_rank()) {
      std::vector<std::string> parts;
      for (const auto& l : layers) {
        parts.push_back(fmt::format("{} {:.1f}+{:.1f} ms ({:.0f}%)", l["name"].get<std::string>(),
                                    l["forward_ms_per_step"].get<double>(), l["backward_ms_per_step"].get<double>(),
                                    100 * l["share"].get<double>()));
      }
      log_info("time by layer a step, forward+backward: {}", fmt::join(parts, ", "));
    }
  }
  json skipped = json::array();
  for (const auto* l : {train_loader.get(), test_loader.get()}) {
    for (const auto& name : l->skipped_names()) skipped.push_back(name);
  }
  json j = {{"test_acc", s.test_acc},
            {"test_top5", s.test_top5},
            {"test_loss", s.test_loss},
            {"train_seconds", s.train_seconds},
            {"step_seconds", st.step_seconds},
            {"eval_seconds", st.train_seconds - st.step_seconds},
            {"data_wait_seconds", st.data_wait_seconds},
            {"wall_seconds", s.wall_seconds},
            {"samples_per_s", s.samples_per_s},
            {"samples", st.samples},
            {"bad_samples_skipped", train_loader->skipped_count() + test_loader->skipped_count()},
            {"skipped_samples", skipped},
            {"doctor", doctor_json.empty() ? json(nullptr) : json::parse(doctor_json)},
            {"breakdown", breakdown},
            {"bottleneck", bottleneck},
            {"layers", layers},
            {"steps", st.step},
            {"epochs", job.train.epochs},
            {"precision", choice.value.dtype_name()},
            {"memory_format", choice.value.memory_format_name()},
            {"precision_source", choice.source},
            {"precision_timed", timed},
            {"step_dtype", stepped ? json(s.step_dtype) : json(nullptr)},
            {"step_channels_last", stepped ? json(s.step_channels_last) : json(nullptr)},
            {"skipped_steps", c.skipped_steps},
            {"oom_retries", c.oom_retries},
            {"host_reads", host_reads},
            {"host_reads_per_step", session_steps > 0 ? json(static_cast<double>(reads) / session_steps) : json(nullptr)},
            {"loss_scale", scaler.enabled() ? json(scaler.scale()) : json(nullptr)},
            {"loss_scale_growth_tracker", scaler.enabled() ? json(scaler.growth_tracker()) : json(nullptr)},
            {"threads", compat::num_threads()},
            {"world_size", world.size},
            {"seed", job.run.seed},
            {"model", job.model.name},
            {"loss", job.loss.name},
            {"params_sha256", s.params_sha256},
            {"resumed_from_step", resumed_from ? json(*resumed_from) : json(nullptr)},
            {"torch_version", compat::torch_version()},
            {"crucible_version", CRUCIBLE_VERSION}};
  if (main_rank()) dir->write_summary(j.dump(2) + "\n");
  if (bottleneck.is_object()) {
    s.bottleneck = fmt::format("{}: {}: {}", bottleneck["verdict"].get<std::string>(),
                               bottleneck["evidence"].get<std::string>(), bottleneck["fix"].get<std::string>());
  }
  return s;
}

TrainSummary Trainer::Impl::evaluate_checkpoint(std::string path) {
  join_world();
  if (main_rank() && path.empty()) {
    if (!newest_checkpoint(&path)) {
      throw bad_input("eval: {}; give --checkpoint FILE or the run's run.dir/run.name", no_checkpoint_reason());
    }
  }
  if (comm) path = comm->broadcast_string("eval", path, 0);
  const CheckpointData ckpt = read_checkpoint(path);
  take_stored_choices(ckpt, path);
  from_checkpoint = true;
  build();
  CheckpointIO::reader(ckpt, path).model("model.", *model);
  st.step = ckpt.meta_int("step", path);
  obs::MetricSinks none;  // eval writes nothing
  evaluate(none);
  TrainSummary s;
  s.run_dir = path;
  s.test_acc = st.last_test_acc;
  s.test_top5 = st.last_test_top5;
  s.test_loss = st.last_test_loss;
  s.steps = st.step;
  s.params_sha256 = params_sha256(*model);
  s.wall_seconds = seconds_since(wall_start);
  return s;
}

// The newest checkpoint that verifies in <run.dir>/<run.name>/checkpoints into `path`; false
// when the folder does not exist or holds none (no_checkpoint_reason() says which).
bool Trainer::Impl::newest_checkpoint(std::string* path) {
  const std::string ckpt_dir = (fs::path(job.run.dir) / job.run.name / "checkpoints").string();
  return fs::is_directory(ckpt_dir) && CheckpointManager(ckpt_dir, 1).load_latest(path).has_value();
}

std::string Trainer::Impl::no_checkpoint_reason() const {
  const std::string ckpt_dir = (fs::path(job.run.dir) / job.run.name / "checkpoints").string();
  return fs::is_directory(ckpt_dir) ? fmt::format("{} holds no checkpoint that verifies", ckpt_dir)
                                    : fmt::format("{} does not exist (no run named {} in {})", ckpt_dir, job.run.name,
                                                  job.run.dir);
}

// predict's model source, the one place it is decided, by rank 0: --checkpoint FILE; else the
// newest checkpoint that verifies in the run folder (what the job trained); else, when the run
// has none, the weights the config names itself: model.init (pretrained weights) or a
// TorchScript module (model.name = "torchscript", as saved). A checkpoint builds the job with its
// stored choices (precision, input convention). Returns the source in words, for the log.
std::string Trainer::Impl::load_predict_model(std::string path) {
  const bool config_weights = !job.model.init.empty() || job.model.name == "torchscript";
  if (main_rank() && path.empty() && !newest_checkpoint(&path) && !config_weights) {
    throw bad_input("predict: {}; give --checkpoint FILE, the run's run.dir/run.name, or weights in the config "
                    "(model.init = \"weights.pt\", or model.name = \"torchscript\" with model.path)",
                    no_checkpoint_reason());
  }
  if (comm) path = comm->broadcast_string("predict", path, 0);  // empty: the config's own weights
  if (path.empty()) {
    build();  // model.init loads (its log names what it did to the head), or the TorchScript module
    st.step = 0;
    return job.model.name == "torchscript" && job.model.init.empty()
               ? fmt::format("TorchScript module {} as saved", job.model.path)
               : fmt::format("{} with model.init weights from {}", job.model.name, job.model.init);
  }
  const CheckpointData ckpt = read_checkpoint(path);
  take_stored_choices(ckpt, path);
  from_checkpoint = true;
  build();
  CheckpointIO::reader(ckpt, path).model("model.", *model);
  st.step = ckpt.meta_int("step", path);
  return fmt::format("model of step {} from {}", st.step, path);
}

PredictSummary Trainer::Impl::predict(const PredictOptions& options) {
  const PredictFormat format = check_predict_options(options);  // bad usage fails before any work
  join_world();
  PredictSummary s;
  s.model = load_predict_model(options.checkpoint);
  sync_bn_buffers();  // M2, as evaluate()
  const auto t0 = Clock::now();
  const Predictions p =
      Predictor(*model, *test_loader, *input, *loss, choice.value, device, comm.get()).run(options.top_k);
  if (p.classes > 0 && p.k < options.top_k) {
    log_info("predict: --top {} is more than the model's {} classes: each record lists all {}", options.top_k,
             p.classes, p.k);
  }
  if (main_rank()) write_predictions(options.out, p, format);  // law 4
  s.out = options.out;
  s.samples = p.size();
  s.k = p.k;
  s.classes = p.classes;
  s.step = st.step;
  s.top1_acc = p.top1_accuracy();
  s.topk_acc = p.topk_accuracy();
  log_info("predict: {} samples in {:.1f} s{}", s.samples, seconds_since(t0),
           comm ? fmt::format(" over {} ranks", world.size) : std::string());
  return s;
}

TrainSummary Trainer::Impl::run() {
  join_world();
  dir = std::make_unique<RunDir>(job, flags.resume, flags.restart, main_rank());
  CheckpointManager& checkpoints = dir->checkpoints();
  std::string ckpt_path;
  std::optional<CheckpointData> ckpt;
  if (main_rank()) ckpt = checkpoints.load_latest(&ckpt_path);
  if (comm) {
    // Rank 0 chose the checkpoint (after any --restart cleanup); every rank resumes from it (X3).
    ckpt_path = comm->broadcast_string("resume", ckpt ? ckpt_path : std::string(), 0);
    if (!main_rank() && !ckpt_path.empty()) {
      try {
        ckpt = read_checkpoint(ckpt_path);
      } catch (const Error& e) {
        throw runtime_error("rank {} cannot read the checkpoint rank 0 resumes from (is {} shared between the "
                            "machines?): {}",
                            world.rank, checkpoints.dir(), e.what());
      }
    }
  }
  if (ckpt) take_stored_choices(*ckpt, ckpt_path);
  from_checkpoint = ckpt.has_value();
  build();
  const std::string metrics_path = dir->metrics_path();
  if (ckpt) {
    CheckpointIO io = CheckpointIO::reader(*ckpt, ckpt_path);
    checkpoint_fields(io);
    resumed_from = st.step;
    log_info("resumed from {}: step {} (epoch {}, batch {} of {})", ckpt_path, st.step, st.epoch + 1,
             st.batch_in_epoch, steps_per_epoch);
    // Records past the checkpoint will be written again by this session.
    if (main_rank()) {
      obs::filter_jsonl(metrics_path, [&](const json& r) { return r.value("step", int64_t{0}) <= st.step; });
      obs::truncate_events(dir->tensorboard_dir(), st.step);
    }
  } else {
    if (flags.resume) throw bad_input("--resume: {} holds no checkpoint that verifies", checkpoints.dir());
    std::error_code ec;
    if (main_rank()) {
      fs::remove(metrics_path, ec);
      fs::remove_all(dir->tensorboard_dir(), ec);
    }
  }
  if (comm) {
    // Every replica starts from rank 0's weights, whatever its own initialisation or resume did.
    distributed::broadcast_module(*comm, *model, 0);
  }
  const int64_t stop_step = job.train.max_steps > 0 ? std::min(job.train.max_steps, total_steps) : total_steps;
  if (st.step >= stop_step && st.last_eval_step == st.step) {
    log_info("run {} is already complete at step {} (test accuracy {:.2f}%); pass --restart to train it again",
             dir->path(), st.step, 100 * st.last_test_acc);
    return summarize(/*already_complete=*/true);
  }

  // Law 4: rank 0 writes the metrics and draws progress (X6, X7).
  obs::MetricSinks sinks;
  if (main_rank()) {
    sinks.add(std::make_unique<obs::JsonlSink>(metrics_path));
    sinks.add(std::make_unique<obs::ProgressSink>(obs::parse_progress_mode(job.log.progress, stdout_is_terminal()),
                                                  job.train.epochs, steps_per_epoch, total_steps));
    if (job.log.tensorboard) {
      sinks.add(std::make_unique<obs::TensorBoardSink>(dir->tensorboard_dir(), st.step, resolved_toml(job),
                                                       hyperparameters(job)));
    }
  }
  g_stop.store(false);
  Schedule::Point sp = schedule->at(st.step);
  host_reads_at_start = host_read_counts();
  first_step = st.step;

  while (st.step < stop_step && st.epoch < job.train.epochs) {
    train_loader->start_epoch(st.epoch, st.batch_in_epoch);
    while (st.step < stop_step) {
      step_begin = Clock::now();
      clock->start();
      std::optional<data::Batch> batch = train_loader->next();
      if (!batch) break;
      clock->lap(Phase::kDataWait);
      st.data_wait_seconds += seconds_since(step_begin);

      sp = schedule->at(st.step);
      bool stop = false;
      const bool histograms = job.log.histogram_every > 0 && !sinks.empty() &&
                              (st.step + 1) % job.log.histogram_every == 0;
      obs::NamedHistograms grad_histograms;
      if (histograms) {
        step->before_update = [&](const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) {
          for (size_t i = 0; i < names.size(); ++i) {
            if (grads[i].defined()) grad_histograms.emplace_back("grad/" + names[i], histogram_of(grads[i]));
          }
        };
      }
      if (layer_profiler) layer_profiler->arm();
      train_step(*batch, sp, &stop);
      if (layer_profiler) layer_profiler->disarm();
      step->before_update = nullptr;
      ++st.step;
      ++st.batch_in_epoch;
      st.samples += batch->size() * world.size;  // global (exact unless the skip policy dropped samples)
      st.interval_samples += batch->size();
      sinks.step_done(st.step, st.epoch);
      if (histograms) {  // weights after the update, gradients as the update used them
        obs::NamedHistograms named;
        for (const auto& p : model->named_parameters()) named.emplace_back("weight/" + p.name, histogram_of(p.tensor));
        for (auto& g : grad_histograms) named.push_back(std::move(g));
        sinks.histograms(st.step, named);
      }
      clock->lap(Phase::kOther);
      if (st.step % job.log.every_steps == 0) read_interval(sinks, sp.lr, sp.momentum);
      clock->lap(Phase::kOther);
      count_step_time();  // the step ends here; evaluation and checkpoints are counted apart
      clock->pause();
      const bool epoch_end = st.batch_in_epoch == steps_per_epoch;
      if (comm ? stop : g_stop.load()) {
        sinks.pause();
        save_checkpoint();
        throw runtime_error("interrupted at step {}: checkpoint written; run the same command again to resume",
                            st.step);
      }
      if (!epoch_end && st.step % job.checkpoint.every_steps == 0) save_checkpoint();
    }
    if (st.batch_in_epoch == steps_per_epoch) {
      sinks.pause();
      evaluate(sinks);
      ++st.epoch;
      st.batch_in_epoch = 0;
      save_checkpoint();
      if (job.train.release_cache) compat::release_cached_memory(device);  // T13
    }
  }
  sinks.pause();
  if (st.last_eval_step != st.step) {  // stopped by train.max_steps inside an epoch
    evaluate(sinks);
    save_checkpoint();
  }
  if (main_rank()) export_model(*model, dir->path());
  sinks.finish(st.step);
  session_loader_busy = train_loader->busy_seconds();
  TrainSummary summary = summarize(/*already_complete=*/false);
  write_report();
  if (main_rank() && !summary.bottleneck.empty()) log_info("bottleneck: {}", summary.bottleneck);
  return summary;
}

Trainer::Trainer(JobConfig job, TrainFlags flags) : impl_(std::make_unique<Impl>(std::move(job), flags)) {}
Trainer::~Trainer() = default;

TrainSummary Trainer::run() { return impl_->run(); }
TrainSummary Trainer::evaluate_checkpoint(const std::string& path) { return impl_->evaluate_checkpoint(path); }
PredictSummary Trainer::predict(const PredictOptions& options) { return impl_->predict(options); }

}  // namespace crucible::train
