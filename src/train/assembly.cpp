// Assembling a Job from its config (see job.h), stage by stage: join the world, data, model,
// precision, optimization, data parallel, step. Each stage reads the config and what the
// stages before it built, and says in the log what it chose and why.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/loader/device_feeder.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/formats/source.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/lint.h"
#include "crucible/nn/model_options.h"
#include "crucible/obs/layer_profile.h"
#include "crucible/obs/phase_clock.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/data_setup.h"
#include "crucible/data/samplers/grouped_sampler.h"
#include "crucible/train/doctor_checks.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/fine_tune.h"
#include "crucible/train/job.h"
#include "crucible/train/loss.h"
#include "crucible/train/multi_scale.h"
#include "crucible/train/recipe.h"
#include "crucible/train/schedule.h"
#include "crucible/train/step.h"

#ifndef CRUCIBLE_VERSION
#define CRUCIBLE_VERSION "0.0.0"
#endif

namespace crucible::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Compute threads: this machine's cores shared by its processes; the seeds of every stream (T15).
void assemble_threads(Job& job) {
  const uint64_t seed = static_cast<uint64_t>(job.config.run.seed);
  compat::set_num_threads(compute_threads(job.config, job.world.local_size));
  const bool tuned = tune_host_allocator();
  log_info("crucible {} on libtorch {}: {} compute thread(s), device {}{}", CRUCIBLE_VERSION, compat::torch_version(),
           compat::num_threads(), job.device.str(), tuned ? ", host allocator tuned" : "");
  log_info("seed {} → streams: init {}, sampler {}, augment {}, dropout {} (T15)", seed,
           derive_seed(seed, RngStream::kInit), derive_seed(seed, RngStream::kSampler),
           derive_seed(seed, RngStream::kAugment), derive_seed(seed, RngStream::kDropout));
}

// Data: the pipelines (with the recipe's sample transforms), the loader threads (D10), and a
// loader each for training (the recipe's sampler: X1) and evaluation (sequential shards, padded,
// the padding dropped after the gather: X2).
void assemble_data(Job& job, const StoredChoices& stored) {
  const JobConfig& c = job.config;
  const uint64_t seed = static_cast<uint64_t>(c.run.seed);
  const auto t0 = Clock::now();
  // X8: rank 0 opens the data first, so what opening writes beside it (a tar shard's .idx) is
  // written once, by one process; the others open after it and read what it wrote (on a node
  // that does not share rank 0's file system they build their own, each written atomically).
  data::DataSetup ds;
  const auto open = [&] {
    if (const double ms = job.env.seams.rank0_open_delay_ms; ms > 0 && job.world.rank == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(1000 * ms)));
    }
    ds = data::make_data(c.data, derive_seed(seed, RngStream::kAugment), job.inference);
  };
  distributed::rank0_then_all(job.comm.get(), "open the data", open);
  if (job.comm && job.comm->rank() != 0) open();
  if (const std::string& trace = job.env.seams.step_trace; !trace.empty()) {
    write_file_atomic(fmt::format("{}.rank{}.data", trace, job.world.rank),
                      ds.train->describe() + "\n" + ds.test->describe() + "\n");
  }
  const data::ImageSpec spec = ds.train->output_spec();
  job.num_classes = ds.num_classes;
  job.detection = ds.test->detection();
  job.test_truth = ds.test_truth;
  if (stored.num_classes) {
    if (ds.num_classes > *stored.num_classes) {
      throw bad_input("{}: the model was trained on {} classes but the data holds {} (labels up to {}); is this the "
                      "run's data?",
                      stored.input_source, *stored.num_classes, ds.num_classes, ds.num_classes - 1);
    }
    job.num_classes = *stored.num_classes;  // a test split may lack the last classes
  }
  if (job.inference) {
    log_info("data: {} test samples of {} ({} classes{}), opened in {:.1f} s; the training split is not opened",
             ds.test->size(), spec.to_string(), job.num_classes, ds.test->target_width() > 0 ? ", multi-label" : "",
             seconds_since(t0));
  } else {
    log_info("data: {} training and {} test samples of {} ({} classes{}), opened in {:.1f} s", ds.train->size(),
             ds.test->size(), spec.to_string(), ds.num_classes, ds.train->target_width() > 0 ? ", multi-label" : "",
             seconds_since(t0));
    log_info("train pipeline: {}", ds.train->describe());
  }
  log_info("test pipeline: {}", ds.test->describe());

  job.loader_threads = static_cast<int>(c.data.threads);
  if (job.loader_threads == 0) {
    // D10: in-RAM arrays need little; decoded images get the count measured fastest.
    const int cores = std::max(1, available_cores() / std::max(1, job.world.local_size));
    job.loader_threads = c.data.dataset != DataSection::Dataset::kImages
                             ? std::max(1, compute_threads(c, job.world.local_size) / 2)
                             : data::choose_loader_threads(*ds.train, cores, &job.loader_choice);
  }
  data::LoaderOptions train_options = data::loader_options(c.data, c.train.batch_size, job.loader_threads);
  data::LoaderOptions test_options = data::loader_options(c.data, c.train.eval_batch_size, job.loader_threads);
  train_options.allocate = test_options.allocate = data::DeviceInput::batch_allocator(job.device);  // D9
  if (const double ms = job.env.seams.sample_delay_ms; ms > 0) {
    train_options.sample_delay = std::chrono::microseconds(static_cast<int64_t>(1000 * ms));
    log_warn("{}={}: every training sample takes {} ms longer to load (test seam)", testing::kSampleDelayEnv, ms, ms);
  }
  const data::Sampler::Shard shard{job.world.size, job.world.rank, /*drop_last=*/false};
  data::SamplerBuild order;
  order.size = ds.train->size();
  order.seed = derive_seed(seed, RngStream::kSampler);
  order.shard = shard;
  order.batch = c.train.batch_size;
  order.shard_counts = ds.train->shard_counts();
  order.remote = data::is_remote_path(c.data.train_path) && c.data.dataset == data::DataConfig::Dataset::kImages;
  order.aspect_ratios = data::aspect_ratios_of(*ds.train);  // detection: batches grouped by aspect ratio
  job.train_loader =
      std::make_unique<data::Loader>(ds.train, data::make_training_sampler(c.data, order), train_options);
  job.test_loader = std::make_unique<data::Loader>(
      ds.test, data::DistributedSampler(ds.test->size(), /*shuffle=*/false, 0, shard), test_options);
  log_info("train order: {}", job.train_loader->sampler().describe());
  job.steps_per_epoch = job.train_loader->batches_per_epoch();
  job.total_steps = job.steps_per_epoch * c.train.epochs;
}

// Model: weights from the init stream (or model.init's file), then torch's generator moves to
// the dropout stream; the lint (M7) and the loss.
void assemble_model(Job& job, const StoredChoices& stored) {
  const JobConfig& c = job.config;
  const uint64_t seed = static_cast<uint64_t>(c.run.seed);
  const data::ImageSpec spec = job.train_loader->pipeline().output_spec();
  if (job.detection && !nn::model_settings_registry().get(c.model.name, "model.name").factory.detector) {
    // Before the model is built: a classifier would fail on the detection set's shape instead.
    throw bad_input("data.dataset = \"detection\" needs a detector, and model.name = \"{}\" classifies; set model.name "
                    "to one of fcos_resnet{{18,34,50}}_fpn or retinanet_resnet{{18,34,50}}_fpn", c.model.name);
  }
  compat::seed_cpu_generator(derive_seed(seed, RngStream::kInit));
  job.model = nn::make_model(c.model, spec.channels, spec.height, spec.width, job.num_classes);
  if (!c.model.init.empty() && !stored.from_checkpoint) {
    // Fine-tuning: the file's weights by name; a head of another class count keeps its fresh init.
    const InitReport r = load_initial_weights(*job.model, c.model, job.num_classes);
    for (const auto& n : r.notes) log_info("model.init: {} (X4)", n);
    log_info("model.init: {} tensors from {}{}", r.loaded, c.model.init,
             r.ignored.empty() ? "" : fmt::format("; not loaded (model.init_ignore): {}", fmt::join(r.ignored, ", ")));
    for (const auto& h : r.reinitialised) {
      log_info("model.init: classifier head {} re-initialised for the data's {} classes", h, job.num_classes);
    }
    if (r.kept > 0) log_info("model.init: {} tensors outside the trunk keep their initialisation", r.kept);
  }
  const bool detector = dynamic_cast<nn::Detector*>(job.model.get()) != nullptr;
  if (detector && !job.detection) {
    throw bad_input("model.name = \"{}\" is a detector: it trains on images with boxes (data.dataset = "
                    "\"detection\"), not on class labels", c.model.name);
  }
  job.model->to(job.device);
  job.model->train(true);
  compat::seed_cpu_generator(derive_seed(seed, RngStream::kDropout));
  compat::seed_device_generator(job.device, derive_seed(seed, RngStream::kDropout));
  log_info("model: {}, {} parameters", job.model->describe(), nn::parameter_count(*job.model));
  if (job.model->nn_module() != nullptr) {
    for (const auto& w : nn::lint_bias_before_norm(*job.model->nn_module())) log_warn("model lint (M7): {}", w);
  }
  job.loss = make_loss({c.loss, job.num_classes, job.device, job.train_loader->pipeline().target_width() > 0});
  if (detector) {
    log_info("loss: the detector's own loss dict (its terms summed; the [loss] keys do not apply)");
  } else {
    log_info("loss: {}", job.loss->describe());
  }
}

// precision = "auto" on a GPU: times one whole training step (TrialStep: the step that trains)
// of each safe candidate on a scratch copy of the model and one real batch, and picks the
// fastest. The scratch model is initialised from a saved generator state, so the run's own
// random streams are untouched.
void time_precisions(Job& job) {
  const JobConfig& c = job.config;
  const data::SamplePipeline& pipeline = job.train_loader->pipeline();
  const data::ImageSpec spec = pipeline.output_spec();
  const at::Tensor rng_state = compat::cpu_generator_state();
  const at::Tensor device_rng_state = job.device.is_cuda() ? compat::generator_state(job.device) : at::Tensor();
  const int64_t n = std::min<int64_t>(c.train.batch_size, pipeline.size());
  const data::Batch batch = data::sample_batch(pipeline, n);
  std::vector<PrecisionTiming> candidates = {{{ComputeDtype::kFp32, false}}, {{ComputeDtype::kFp32, true}}};
  if (compat::autocast_supported(job.device.type(), c10::ScalarType::BFloat16)) {
    candidates.push_back({{ComputeDtype::kBf16, false}});
    candidates.push_back({{ComputeDtype::kBf16, true}});
  }
  for (auto& cand : candidates) {
    TrialStep trial(c, spec.channels, spec.height, spec.width, job.num_classes, cand.precision, job.device);
    data::DeviceInput in(spec, normalize_options(c), job.device, cand.precision.channels_last);
    const at::Tensor x = in.images(batch), y = in.labels(batch);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      trial.run(x, y);  // ends in a host read: the clock measures the work
      if (rep >= 1) best = std::min(best, seconds_since(t0) * 1000.0);  // the first is warm-up
    }
    cand.ms = best;
  }
  compat::set_cpu_generator_state(rng_state);
  if (device_rng_state.defined()) compat::set_generator_state(job.device, device_rng_state);
  const PrecisionTiming* pick = &candidates[0];
  std::string table;
  for (const auto& cand : candidates) {
    table += fmt::format("{}{} {:.1f} ms", table.empty() ? "" : ", ", cand.precision.to_string(), cand.ms);
    if (cand.ms < pick->ms) pick = &cand;
  }
  job.precision.timed = candidates;
  job.precision.value = pick->precision;
  log_info("precision auto: a training step on a batch of {}: {} → {} (the fastest; fp16 is not a candidate: it "
           "needs a loss scaler and has no CPU autocast in every libtorch)",
           n, table, job.precision.value.to_string());
}

// The precision and memory format: as a resumed run chose, as configured, or auto (a rule on a
// CPU, timed on a GPU by rank 0, whose choice every rank takes: replicas must compute alike).
void choose_precision(Job& job, const StoredChoices& stored) {
  const JobConfig& c = job.config;
  PrecisionChoice& choice = job.precision;
  if (stored.precision) {
    choice.value = *stored.precision;
    choice.source = "checkpoint";
    return;
  }
  if (c.train.precision != PrecisionMode::kAuto) {
    choice.value = configured_precision(c.train.precision, c.train.channels_last);
    choice.source = "configured";
    if (job.main_rank() && choice.value.dtype == ComputeDtype::kBf16 && !job.device.is_cuda() && !job.cpu_bf16) {
      log_warn("train.precision = \"bf16\" on a CPU without bf16 arithmetic (no avx512_bf16, amx_bf16 or bf16 in "
               "/proc/cpuinfo): autocast emulates it, several times slower than fp32 (`crucible doctor` measures "
               "it); set train.precision = \"auto\" (fp32 here) or \"fp32\"");
    }
    return;
  }
  choice.source = "auto";
  if (job.detection && job.device.is_cuda()) {
    // A detection batch's shapes change from batch to batch, and TrialStep times a classifier's
    // step: by rule, as torchvision's reference trains detectors (--amp), bf16 where it runs.
    const bool bf16 = compat::autocast_supported(job.device.type(), c10::ScalarType::BFloat16);
    choice.value = bf16 ? Precision{ComputeDtype::kBf16, false} : Precision{ComputeDtype::kFp32, false};
    log_info("precision auto: a detector on a GPU → {} (by rule, not timed: detection batches change shape)",
             choice.value.to_string());
  } else if (!job.device.is_cuda()) {
    // A CPU: by rule (cpu_auto_precision), the same on every rank of the machine and every run.
    choice.value = cpu_auto_precision(job.cpu_bf16, c.train.channels_last);
    log_info("precision auto: {} → {}",
             job.cpu_bf16 ? fmt::format("this CPU computes bf16 in hardware ({})", job.cpu_bf16_flag)
                          : std::string("this CPU has no bf16 arithmetic (no avx512_bf16, amx_bf16 or bf16 in "
                                        "/proc/cpuinfo): bf16 would be emulated, several times slower than fp32"),
             choice.value.to_string());
  } else if (job.main_rank()) {
    time_precisions(job);
  }
  if (job.comm) {
    choice.value = Precision::parse(job.comm->broadcast_string("precision", choice.value.to_string(), 0),
                                    "rank 0's precision choice");
  }
}

// Precision: the start-up checks (rank 0), the choice, the input the model takes (law 3), the
// loss scaler (T1), and the device's numerics: determinism (M6), matmul precision (T5), cuDNN
// benchmark (T9), sync debug (T14).
void assemble_precision(Job& job, const StoredChoices& stored) {
  const JobConfig& c = job.config;
  job.cpu_bf16 = cpu_has_native_bf16(&job.cpu_bf16_flag);
  if (job.main_rank()) {
    const DoctorReport quick = run_doctor_quick(c, job.world.local_size);
    for (const auto& check : quick.checks) {
      if (check.status != DoctorCheck::Status::kOk) {
        log_warn("doctor: {}: {}{}", check.name, check.found, check.fix.empty() ? "" : " → " + check.fix);
      }
    }
    job.doctor_json = doctor_checks_json(quick);
  }
  choose_precision(job, stored);
  const Precision& precision = job.precision.value;
  if (precision.channels_last) nn::to_channels_last(*job.model);
  const data::ImageSpec spec = job.train_loader->pipeline().output_spec();
  job.input = std::make_unique<data::DeviceInput>(spec, normalize_options(c), job.device, precision.channels_last);
  // D9: on a GPU the next data.prefetch batches are copied on a side stream while a step runs;
  // CRUCIBLE_TEST_FEEDER_AHEAD forces a depth on any device (the weights must not change).
  int64_t ahead = job.device.is_cuda() ? c.data.prefetch : 0;
  if (const int64_t forced = job.env.seams.feeder_ahead; forced >= 0) {
    log_warn("{}={}: the feeder runs {} batch(es) ahead in place of {} (test seam)", testing::kFeederAheadEnv, forced,
             forced, ahead);
    ahead = forced;
  }
  job.feeder = std::make_unique<data::DeviceFeeder>(*job.input, job.device, data::DeviceFeeder::Options{ahead, false});
  // Law 3: the input the model takes — as built, or as trained (a checkpoint's) — against what
  // the pipeline delivers; a model trained here keeps the pipeline's convention from now on.
  const nn::InputSpec expected = stored.input ? *stored.input : job.model->input_spec();
  nn::check_input(expected, job.input->delivers(),
                  stored.input ? "the model in " + stored.input_source : "model " + c.model.name);
  job.model_input = expected.order ? expected : expected.trained_on(job.input->delivers());
  log_info("input: {}, {}; loader: {}, prefetch {}, bad samples: {}", job.input->describe(), job.feeder->describe(),
           job.loader_choice.empty() ? fmt::format("{} thread(s)", job.loader_threads) : job.loader_choice,
           c.data.prefetch, data::bad_sample_policy_name(c.data.bad_samples));
  if (precision.mixed() && !compat::autocast_supported(job.device.type(), autocast_dtype(precision))) {
    throw bad_input("train.precision = \"{}\": libtorch {} has no {} autocast on {}; use \"bf16\" or \"fp32\"",
                    precision.dtype_name(), compat::torch_version(), precision.dtype_name(), job.device.str());
  }
  job.scaler = GradScaler(grad_scaler_options(c, precision));
  log_info("precision: {}{}, memory format {}{}", precision.dtype_name(),
           precision.mixed() ? " (autocast mixed precision)" : "", precision.memory_format_name(),
           job.scaler.enabled() ? fmt::format(", dynamic loss scale from {}", job.scaler.scale()) : "");
  // (set_deterministic and enable_sync_debug ran in join_job, before the device started)
  if (c.train.deterministic) {
    log_info("deterministic algorithms on (M6{}); still free to differ: results across thread counts (BLAS and "
             "reduction splits), library versions and devices, and any op without a deterministic kernel (it "
             "raises)",
             job.determinism_env.empty() ? "" : "; set " + job.determinism_env);
  }
  compat::set_matmul_precision(c.train.matmul_precision);
  // T9: autotuning pays when every batch has the pipeline's fixed shape; under multi_scale each
  // new size would be tuned again (and cached), so it is off, as in deterministic mode.
  const bool multi_scale = !c.pieces.get<MultiScaleOptions>(kMultiScalePiece).sizes.empty();
  compat::set_cudnn_benchmark(!c.train.deterministic && !multi_scale);
  if (multi_scale && !c.train.deterministic) {
    log_info("cuDNN benchmark mode off (T9): train.multi_scale changes the input shape from step to step");
  }
  if (c.train.sync_debug) {
    log_info("sync debug (T14): every GPU kernel is synchronised (CUDA_LAUNCH_BLOCKING=1), errors point at their "
             "own line, and torch warns at every host synchronisation (sync-debug mode {})",
             compat::sync_debug_mode());
  }
}

// Optimization: what trains (model.freeze), the parameter groups (T4: no weight decay on biases
// and normalisation weights), the optimizer, the lr scaled with the global batch (T7) and the
// schedule.
void assemble_optimization(Job& job) {
  const JobConfig& c = job.config;
  std::vector<std::string> frozen;
  job.params = trainable_parameters(*job.model, c.model.freeze, &frozen);
  if (!frozen.empty()) {
    log_info("model.freeze: {} parameter tensor(s) kept fixed, not optimised nor synced: {}", frozen.size(),
             fmt::join(frozen, ", "));
  }
  std::vector<ParamGroup> groups = parameter_groups(c.optim, job.params);
  log_info("parameter groups (T4): {} tensors with weight decay {}, {} biases/norm weights with {}",
           groups[0].params.size(), groups[0].weight_decay, groups[1].params.size(), groups[1].weight_decay);
  job.optimizer = make_optimizer(c.optim, std::move(groups));
  const int64_t batch = global_batch(c.train, job.world.size);
  const double lr = c.optim.lr_per_256 > 0 ? c.optim.lr_per_256 * static_cast<double>(batch) / 256.0 : c.optim.lr;
  if (c.optim.lr_per_256 > 0) {
    log_info("lr = {} per 256 samples × global batch {}{} / 256 = {} (T7)", c.optim.lr_per_256, batch,
             job.comm ? fmt::format(" ({} ranks × {})", job.world.size, c.train.batch_size) : "", lr);
  }
  // eval and predict step nowhere: their "training" split is the test split, whose length says
  // nothing of the run's schedule (a short test set must not fail a schedule's checks).
  if (job.inference) return;
  job.schedule =
      std::make_unique<Schedule>(c.schedule, lr, optimizer_momentum(c.optim), job.total_steps, job.steps_per_epoch);
}

// Data parallel: SyncBatchNorm before gradient sync is set up (M3), then DDP's reducer (M5,
// T11). dist.bn = sync in one process computes what N processes compute, so a run can be
// compared across world sizes.
void assemble_data_parallel(Job& job) {
  const JobConfig& c = job.config;
  if (!job.comm && c.dist.bn == DistSection::Bn::kSync) {
    // torch's CPU kernel accumulates channels_last statistics in float (relative error ~4e-4
    // measured at batch 256); the SyncBatchNorm computation combines them in double.
    const int n = nn::convert_sync_batchnorm(nn::require_nn_module(*job.model, "dist.bn = sync"), &job.local_collective);
    log_info("dist.bn = sync in one process: {} BatchNorm layer(s) use the SyncBatchNorm computation", n);
  }
  if (!job.comm) return;
  if (c.dist.bn == DistSection::Bn::kSync) {
    const int n = nn::convert_sync_batchnorm(nn::require_nn_module(*job.model, "dist.bn = sync"), job.comm.get());
    log_info("dist.bn = sync: {} BatchNorm layer(s) take statistics over all {} ranks (M3)", n, job.world.size);
  } else {
    log_info("dist.bn = {}: BatchNorm statistics per rank, made equal ({}) before evaluation and checkpoints (M2)",
             bn_name(c.dist.bn), c.dist.bn == DistSection::Bn::kBroadcast ? "rank 0's" : "averaged");
  }
  std::vector<at::Tensor> tensors;
  for (const auto& p : job.params) tensors.push_back(p.tensor);
  job.grad_sync = std::make_unique<distributed::GradSync>(*job.comm, tensors, c.dist.bucket_mb);
  if (const double ms = job.env.seams.allreduce_delay_ms; ms > 0) {
    job.grad_sync->set_test_delay(std::chrono::microseconds(static_cast<int64_t>(1000 * ms)));
    log_warn("{}={}: every gradient sync takes {} ms longer (test seam)", testing::kAllReduceDelayEnv, ms, ms);
  }
  log_info("gradient sync: {}, all-reduced during backward", job.grad_sync->describe());
}

// The step: TrainStep with its clock (the breakdown) and layer profiler, the evaluator, and the
// recipe's batch transforms and step observers.
void assemble_step(Job& job, const std::string& checkpoint_dir) {
  const JobConfig& c = job.config;
  log_info("optimizer: {}; schedule: {}", job.optimizer->describe(),
           job.schedule ? job.schedule->describe() : std::string("none (evaluation only)"));
  log_info("training: {} epochs × {} steps of batch {}{}{} = {} steps; checkpoint every {} steps, keep {}",
           c.train.epochs, job.steps_per_epoch, c.train.batch_size,
           job.comm ? fmt::format(" per rank × {} ranks = {}", job.world.size, global_batch(c.train, job.world.size))
                    : std::string(),
           c.train.accumulate > 1 ? fmt::format(" ({} micro-batches)", c.train.accumulate) : "", job.total_steps,
           c.checkpoint.every_steps, c.checkpoint.keep);
  TrainStepOptions so;
  so.precision = job.precision.value;
  so.accumulate = c.train.accumulate;
  so.clip_norm = c.train.clip_norm;
  so.max_bad_steps = c.train.max_bad_steps;
  so.checkpoint_dir = checkpoint_dir;
  so.update_norm_every = c.log.every_steps;  // T4: measured at each log interval's last step
  job.step = std::make_unique<TrainStep>(*job.model, *job.loss, *job.optimizer, job.scaler, job.params, so, job.device,
                                         job.comm.get(), job.grad_sync.get());
  job.clock = std::make_unique<obs::PhaseClock>(job.device, c.train.profile != TrainSection::Profile::kOff);
  job.step->set_clock(job.clock.get());
  job.step->before_forward = testing::fail_if_oom_injected;  // T16's test seam
  if (c.train.profile == TrainSection::Profile::kFull) {
    if (job.model->nn_module() == nullptr) {
      log_warn("train.profile = \"full\": {} marks no layers; per-layer times cover the zoo's models only (the "
               "step-time breakdown is kept)",
               c.model.name);
    } else {
      job.layer_profiler = std::make_unique<obs::LayerProfiler>(job.device);
    }
  }
  job.evaluator = std::make_unique<Evaluator>(*job.model, *job.test_loader, *job.input, *job.loss, job.precision.value,
                                              job.device, job.comm.get());
  if (job.detection) job.evaluator->set_ground_truth(job.test_truth);
  job.batch_transforms = make_batch_transforms(job);
  for (const auto& t : job.batch_transforms) {
    // Those that move or mix pixels without the boxes: a detection set's augmentations are its preset's.
    if (job.detection && !t->keeps_boxes()) {
      throw bad_input("data.dataset = \"detection\": the batch transform {} would change the images without their "
                      "boxes; detection augmentations are data.detection_preset's",
                      t->describe());
    }
  }
  job.observers = make_step_observers(job);
  std::vector<std::string> parts;
  for (const auto& t : job.batch_transforms) parts.push_back("batch transform " + t->describe());
  for (const auto& o : job.observers) {
    if (!o->describe().empty()) parts.push_back("step observer " + o->describe());
  }
  if (!parts.empty()) log_info("recipe: {}", fmt::join(parts, "; "));
}

}  // namespace

std::unique_ptr<Job> join_job(JobConfig config) {
  auto job = std::make_unique<Job>();
  job->config = std::move(config);
  const JobConfig& c = job->config;
  job->env = read_environment();
  job->world = distributed::world_from_env();
  set_log_rank(job->world.rank);
  // Before anything touches CUDA (resolve_device below counts the GPUs): the driver reads
  // CUDA_LAUNCH_BLOCKING when it starts (T14) and cuBLAS reads CUBLAS_WORKSPACE_CONFIG when its
  // first handle is made (M6); set later, both silently do nothing.
  if (c.train.sync_debug) compat::enable_sync_debug();
  job->determinism_env = compat::set_deterministic(c.train.deterministic);
  job->device = compat::resolve_device(c.train.device);
  if (const int64_t g = c.train.global_batch_size; g > 0) {  // before the run folder compares configs
    const int64_t ranks = job->world.size;
    if (g % ranks != 0) {
      throw bad_input("train.global_batch_size = {} does not split over {} ranks: use a number of ranks that divides "
                      "it, or another global batch",
                      g, ranks);
    }
    job->config.train.batch_size = g / ranks;
    log_info("batch {} per rank: train.global_batch_size {} over {} rank(s) (train.batch_size not used)", g / ranks, g,
             ranks);
  }
  if (!job->world.launched) return job;
  if (job->device.is_cuda()) {
    distributed::check_devices(job->world, compat::cuda_device_count());
    job->device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(job->world.local_rank));
    compat::bind_device(job->device);
  }
  distributed::CommOptions co;
  co.backend = c.dist.backend;
  co.timeout_s = c.dist.timeout_s;
  const auto t0 = Clock::now();
  job->comm = distributed::Comm::connect(job->world, job->device, co);
  log_info("data parallel: {} processes, {} backend, device {} per process from LOCAL_RANK, timeout {:.0f} s; "
           "joined in {:.1f} s; {}",
           job->world.size, job->comm->backend(), job->device.str(), c.dist.timeout_s, seconds_since(t0),
           job->world.describe());
  return job;
}

void assemble_data_stages(Job& job) {
  assemble_threads(job);
  assemble_data(job, {});
}

void assemble_job(Job& job, const StoredChoices& stored, const std::string& checkpoint_dir) {
  assemble_threads(job);
  assemble_data(job, stored);
  assemble_model(job, stored);
  assemble_precision(job, stored);
  assemble_optimization(job);
  assemble_data_parallel(job);
  assemble_step(job, checkpoint_dir);
}

}  // namespace crucible::train
