// Trainer: the loop (see trainer.h). The job is assembled by assembly.cpp; what a step does is
// TrainStep's, evaluation is the Evaluator's, the checkpoint's contents are listed once in
// checkpoint_fields(), the folder is RunDir's, the metrics go to MetricSinks, and everything
// else a recipe adds is a batch transform or a step observer.
#include "crucible/train/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/core/log.h"
#include "crucible/data/device_input.h"
#include "crucible/data/loader.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/distributed/launch.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/model.h"
#include "crucible/obs/jsonl.h"
#include "crucible/obs/layer_profile.h"
#include "crucible/obs/metric_sink.h"
#include "crucible/obs/phase_clock.h"
#include "crucible/obs/report.h"
#include "crucible/obs/tensorboard.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/doctor_checks.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/job.h"
#include "crucible/train/loss.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/run_dir.h"
#include "crucible/train/run_state.h"
#include "crucible/train/schedule.h"
#include "crucible/train/step.h"
#include "crucible/train/summary.h"

#ifndef CRUCIBLE_VERSION
#define CRUCIBLE_VERSION "0.0.0"
#endif

namespace crucible::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using obs::Phase;

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

bool export_model(nn::Model& model, const std::string& run_dir, const std::string& stem) {
  const std::string st = run_dir + "/" + stem + ".safetensors";
  const std::string program = model.save_program(run_dir, stem);
  if (program.empty()) return false;
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
  log_info("trained {} → {} ({}) and {} (safetensors, state_dict names)", stem, program,
           program.size() > 4 && program.compare(program.size() - 4, 4, ".pt2") == 0 ? "torch.export" : "TorchScript", st);
  return true;
}

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

struct Trainer::Impl {
  JobConfig config;
  TrainFlags flags;
  Clock::time_point wall_start = Clock::now();
  std::unique_ptr<Job> job;
  std::unique_ptr<RunDir> dir;
  RunState st;
  SessionRecord session;  // this session's host reads, phases and step time (summary.h)
  Clock::time_point step_begin;
  double interval_loader_busy = 0;
  int64_t interval_first_step = 0;  // the step the current log interval began at
  std::chrono::microseconds slow_step{0};  // test seam (kSlowRankEnv) for this rank
  EvalFigures last_eval_figures;  // the step observers' figures of the last evaluation
  std::unique_ptr<FILE, int (*)(FILE*)> step_trace{nullptr, &std::fclose};  // test seam (M4)
  // crucible launch's progress file for this rank (kProgressDirEnv): the step it is at, so a
  // failure can be placed and a repeat at the same step recognised. -1: not under crucible launch.
  int progress_fd = -1;
  ~Impl() {
    if (progress_fd >= 0) ::close(progress_fd);
  }

  Impl(JobConfig c, TrainFlags f) : config(std::move(c)), flags(std::move(f)) {}
  bool main_rank() const { return job->main_rank(); }

  TrainSummary run();
  std::optional<CheckpointData> open_run(std::string* ckpt_path);
  void resume_or_start(const std::optional<CheckpointData>& ckpt, const std::string& ckpt_path);
  void add_sinks(obs::MetricSinks& sinks);
  void run_epochs(obs::MetricSinks& sinks, int64_t stop_step);
  void train_step(const data::Batch& batch, const Schedule::Point& sp, obs::MetricSinks& sinks, bool* stop);
  void checkpoint_fields(CheckpointIO& io);
  void save_checkpoint();
  void verify_replicas();
  void evaluate(obs::MetricSinks& sinks);
  void read_interval(obs::MetricSinks& sinks, double lr, double momentum);
  void write_report();
  void count_step_time();
  TrainSummary summarize(bool already_complete);
};

// The run folder (rank 0 creates it) and the checkpoint this run resumes from, chosen by rank 0
// after any --restart cleanup and read by every rank (X3); then the job is assembled with the
// choices the checkpoint stored.
std::optional<CheckpointData> Trainer::Impl::open_run(std::string* ckpt_path) {
  job = join_job(config);
  // Under a launcher that restarts ranks, the folder stays the launch's between restarts (its
  // process is rank 0's parent: crucible launch and torchrun start the ranks themselves).
  std::optional<ProcessId> launcher;
  if (!job->world.run_id.empty()) launcher = parent_process();
  dir = std::make_unique<RunDir>(job->config, flags.resume, flags.restart, main_rank(), launcher);
  std::optional<CheckpointData> ckpt;
  if (main_rank()) ckpt = dir->checkpoints().load_latest(ckpt_path);
  if (job->comm) {
    *ckpt_path = job->comm->broadcast_string("resume", ckpt ? *ckpt_path : std::string(), 0);
    if (!main_rank() && !ckpt_path->empty()) {
      try {
        ckpt = read_checkpoint(*ckpt_path);
      } catch (const Error& e) {
        throw runtime_error("rank {} cannot read the checkpoint rank 0 resumes from (is {} shared between the "
                            "machines?): {}",
                            job->world.rank, dir->checkpoints().dir(), e.what());
      }
    }
  }
  assemble_job(*job, ckpt ? StoredChoices::of(*ckpt, *ckpt_path) : StoredChoices{}, dir->checkpoints().dir());
  if (main_rank()) {  // law 4: rank 0 writes the run folder, so its disk is the one to check
    const DoctorCheck disk = check_disk(config, checkpoint_bytes(config, *job->model, *job->optimizer),
                                        static_cast<int64_t>(dir->checkpoints().list().size()));
    if (disk.status == DoctorCheck::Status::kFail) throw bad_input("disk: {}; {}", disk.found, disk.fix);
    if (disk.status == DoctorCheck::Status::kWarn) log_warn("disk: {}. {}", disk.found, disk.fix);
  }
  job->step->before_forward = [this](int64_t samples) {
    if (g_oom_step.load() == st.step && samples > g_oom_max.load()) throw SimulatedOom();
  };
  if (const char* dir = std::getenv(distributed::kProgressDirEnv); dir != nullptr && *dir != '\0') {
    const std::string path = fmt::format("{}/rank{}", dir, job->world.rank);
    progress_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (progress_fd < 0) log_warn("{}: cannot open {}: {}", distributed::kProgressDirEnv, path, errno_text(errno));
  }
  if (const char* slow = std::getenv(testing::kSlowRankEnv); slow != nullptr && *slow != '\0') {
    int rank = -1;
    double ms = 0;
    if (std::sscanf(slow, "%d:%lf", &rank, &ms) == 2 && rank == job->world.rank && ms > 0) {
      slow_step = std::chrono::microseconds(static_cast<int64_t>(1000 * ms));
      log_warn("{}={}: this rank spends {} ms more on every step (test seam)", testing::kSlowRankEnv, slow, ms);
    }
  }
  if (job->world.restarts > 0) {
    log_warn("launch restart {} of this run (TORCHELASTIC_RESTART_COUNT){}", job->world.restarts,
             job->world.restart_causes.empty() ? "" : "; causes so far: " + job->world.restart_causes);
  }
  if (const char* trace = std::getenv(testing::kStepTraceEnv); trace != nullptr && *trace != '\0') {
    const std::string path = fmt::format("{}.rank{}", trace, job->world.rank);
    step_trace.reset(std::fopen(path.c_str(), "a"));
    if (!step_trace) throw runtime_error("{}={}: cannot open {}", testing::kStepTraceEnv, trace, path);
  }
  return ckpt;
}

// Restores the checkpoint's state (and drops the metrics written past it), or starts afresh;
// then every replica takes rank 0's weights.
void Trainer::Impl::resume_or_start(const std::optional<CheckpointData>& ckpt, const std::string& ckpt_path) {
  const std::string metrics_path = dir->metrics_path();
  if (ckpt) {
    CheckpointIO io = CheckpointIO::reader(*ckpt, ckpt_path);
    checkpoint_fields(io);
    session.resumed_from = st.step;
    log_info("resumed from {}: step {} (epoch {}, batch {} of {})", ckpt_path, st.step, st.epoch + 1,
             st.batch_in_epoch, job->steps_per_epoch);
    // Records past the checkpoint will be written again by this session.
    if (main_rank()) {
      obs::filter_jsonl(metrics_path, [&](const json& r) { return r.value("step", int64_t{0}) <= st.step; });
      obs::truncate_events(dir->tensorboard_dir(), st.step);
    }
  } else {
    if (flags.resume) throw bad_input("--resume: {} holds no checkpoint that verifies", dir->checkpoints().dir());
    std::error_code ec;
    if (main_rank()) {
      fs::remove(metrics_path, ec);
      fs::remove_all(dir->tensorboard_dir(), ec);
    }
  }
  // Every replica starts from rank 0's weights, whatever its own initialisation or resume did.
  if (job->comm) distributed::broadcast_module(*job->comm, *job->model, 0);
}

// Law 4: rank 0 writes the metrics and draws progress (X6, X7).
void Trainer::Impl::add_sinks(obs::MetricSinks& sinks) {
  if (!main_rank()) return;
  const JobConfig& c = job->config;
  sinks.add(std::make_unique<obs::JsonlSink>(dir->metrics_path()));
  sinks.add(std::make_unique<obs::ProgressSink>(obs::parse_progress_mode(c.log.progress, stdout_is_terminal()),
                                                c.train.epochs, job->steps_per_epoch, job->total_steps));
  if (c.log.tensorboard) {
    sinks.add(std::make_unique<obs::TensorBoardSink>(dir->tensorboard_dir(), st.step, resolved_toml(c),
                                                     hyperparameters(c)));
  }
}

TrainSummary Trainer::Impl::run() {
  std::string ckpt_path;
  const std::optional<CheckpointData> ckpt = open_run(&ckpt_path);
  resume_or_start(ckpt, ckpt_path);
  const JobConfig& c = job->config;
  const int64_t stop_step = c.train.max_steps > 0 ? std::min(c.train.max_steps, job->total_steps) : job->total_steps;
  if (st.step >= stop_step && st.last_eval_step == st.step) {
    log_info("run {} is already complete at step {} (test accuracy {:.2f}%); pass --restart to train it again",
             dir->path(), st.step, 100 * st.last_test_acc);
    return summarize(/*already_complete=*/true);
  }
  obs::MetricSinks sinks;
  add_sinks(sinks);
  g_stop.store(false);
  session.start(st.step, *job);
  interval_first_step = st.step;
  run_epochs(sinks, stop_step);
  job->train_loader->pause_clock();  // a stop inside an epoch: its reads end here (D11)
  sinks.pause();
  if (st.last_eval_step != st.step) {  // stopped by train.max_steps inside an epoch
    evaluate(sinks);
    save_checkpoint();
  }
  if (main_rank()) {
    export_model(*job->model, dir->path(), "model");
    for (auto& o : job->observers) o->after_training(*job->model, dir->path());
  }
  sinks.finish(st.step);
  session.loader_busy = job->train_loader->busy_seconds();
  TrainSummary summary = summarize(/*already_complete=*/false);
  write_report();
  if (main_rank() && !summary.bottleneck.empty()) log_info("bottleneck: {}", summary.bottleneck);
  return summary;
}

// Epochs of steps until `stop_step`: each step timed by phase, the interval's metrics read every
// log.every_steps, a checkpoint every checkpoint.every_steps and at every epoch end (after the
// evaluation). A stop request (SIGINT, any rank) checkpoints and ends the run.
void Trainer::Impl::run_epochs(obs::MetricSinks& sinks, int64_t stop_step) {
  const JobConfig& c = job->config;
  obs::PhaseClock& clock = *job->clock;
  while (st.step < stop_step && st.epoch < c.train.epochs) {
    job->train_loader->start_epoch(st.epoch, st.batch_in_epoch);
    while (st.step < stop_step) {
      step_begin = Clock::now();
      clock.start();
      std::optional<data::Batch> batch = job->train_loader->next();
      if (!batch) break;
      clock.lap(Phase::kDataWait);
      st.data_wait_seconds += seconds_since(step_begin);
      const Schedule::Point sp = job->schedule->at(st.step);
      bool stop = false;
      train_step(*batch, sp, sinks, &stop);
      clock.lap(Phase::kOther);
      if (st.step % c.log.every_steps == 0) read_interval(sinks, sp.lr, sp.momentum);
      clock.lap(Phase::kOther);
      count_step_time();  // the step ends here; evaluation and checkpoints are counted apart
      clock.pause();
      const bool epoch_end = st.batch_in_epoch == job->steps_per_epoch;
      if (job->comm ? stop : g_stop.load()) {
        sinks.pause();
        save_checkpoint();
        throw runtime_error("interrupted at step {}: checkpoint written; run the same command again to resume",
                            st.step);
      }
      if (!epoch_end && st.step % c.checkpoint.every_steps == 0) save_checkpoint();
    }
    if (st.batch_in_epoch == job->steps_per_epoch) {
      sinks.pause();
      evaluate(sinks);
      ++st.epoch;
      st.batch_in_epoch = 0;
      save_checkpoint();
      // T13: what the epoch's allocations left cached goes back; the memory held after each epoch
      // end is recorded either way, so a creep shows.
      if (c.train.release_cache) session.released_bytes.push_back(compat::release_cached_memory(job->device));
      session.held_bytes_after.push_back(compat::held_memory_bytes(job->device));
    }
  }
}

// One optimizer step on `batch`: onto the device, through the batch transforms, the step (with
// the gradients handed to the observers that ask for them), then the counters, the sinks and
// the step observers.
void Trainer::Impl::train_step(const data::Batch& batch, const Schedule::Point& sp, obs::MetricSinks& sinks,
                               bool* stop) {
  if (slow_step.count() > 0) std::this_thread::sleep_for(slow_step);  // test seam: a straggler
  if (progress_fd >= 0) {
    const int64_t step = st.step;
    if (::pwrite(progress_fd, &step, sizeof step, 0) != static_cast<ssize_t>(sizeof step)) {  // a hint only
      ::close(progress_fd);
      progress_fd = -1;
    }
  }
  DeviceBatch b{job->input->images(batch), job->input->labels(batch), st.step, job->world.rank, batch.epoch,
                batch.sample_ids, batch.copies};
  apply_batch_transforms(job->batch_transforms, b);
  job->clock->lap(Phase::kTransfer);
  if (step_trace) {
    std::fprintf(step_trace.get(), "%lld %lld\n", static_cast<long long>(st.step),
                 static_cast<long long>(b.images.size(2)));
  }
  std::vector<StepObserver*> want;
  for (auto& o : job->observers) {
    if (o->wants_gradients(st.step + 1)) want.push_back(o.get());
  }
  if (!want.empty()) {
    job->step->before_update = [&want](const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) {
      for (auto* o : want) o->gradients(names, grads);
    };
  }
  if (job->layer_profiler) job->layer_profiler->arm();
  const TrainStep::Result r =
      job->step->run(b.images, b.targets, st.step, sp.lr, sp.momentum, g_stop.load(), batch.sample_ids);
  if (job->layer_profiler) job->layer_profiler->disarm();
  job->step->before_update = nullptr;
  if (job->comm) *stop = r.stop_agreed;  // every rank stops at the same step (SIGINT on any rank)
  ++st.step;
  ++st.batch_in_epoch;
  st.samples += batch.size() * job->world.size;  // global (exact unless the skip policy dropped samples)
  st.interval_samples += batch.size();
  sinks.step_done(st.step, st.epoch);
  for (auto& o : job->observers) o->after_update({st.step, st.epoch, *job->model, sinks, st.batch_in_epoch});
}

// The checkpoint's contents, listed once: written by save_checkpoint, read back on resume.
void Trainer::Impl::checkpoint_fields(CheckpointIO& io) {
  Job& j = *job;
  io.model("model.", *j.model);
  io.tensor_list("optim.", [&j] { return j.optimizer->state(); },
                 [&j](const std::vector<NamedTensor>& s) { j.optimizer->load_state(s); });
  io.tensor_via("rng.torch_cpu", [] { return compat::cpu_generator_state(); },
                [](const at::Tensor& t) { compat::set_cpu_generator_state(t); });
  if (j.device.is_cuda()) {  // its dropout
    const bool found = io.tensor_via("rng.torch_cuda", [&j] { return compat::generator_state(j.device); },
                                     [&j](const at::Tensor& t) { compat::set_generator_state(j.device, t); },
                                     /*required=*/false);
    if (!found) {
      log_warn("{}: no GPU generator state (saved by a CPU run, or before it was kept): dropout on {} draws "
               "from a fresh stream, so this resume is not bit-exact",
               io.path(), j.device.str());
    }
  }
  IntervalSums& sums = j.step->sums();
  io.tensor("metrics.loss_sum", sums.loss_sum);
  io.tensor("metrics.correct", sums.correct);
  if (io.reading()) sums.grad_norm_max.zero_(), sums.clipped_norm_max.zero_();  // absent before issue 10
  io.tensor("metrics.grad_norm_max", sums.grad_norm_max, /*required=*/false);
  io.tensor("metrics.clipped_norm_max", sums.clipped_norm_max, /*required=*/false);
  io.state(st);
  int64_t saved_total = j.total_steps;
  io.value("total_steps", saved_total);
  if (io.reading() && saved_total != j.total_steps) {
    throw bad_input("{}: checkpoint was written for {} total steps, this job has {}", io.path(), saved_total,
                    j.total_steps);
  }
  io.note("precision", j.precision.value.dtype_name());
  io.note("memory_format", j.precision.value.memory_format_name());
  io.note("model_input", j.model_input.to_json());  // law 3 (read before assembly: StoredChoices)
  io.note("num_classes", std::to_string(j.num_classes));  // predict needs no training data
  if (io.reading()) {
    j.scaler.restore(*io.input(), io.path());  // T1
  } else {
    j.scaler.save(*io.output());
  }
  StepCounters& counters = j.step->counters();
  io.value("skipped_steps", counters.skipped_steps);
  io.value("bad_in_row", counters.bad_in_row);
  io.value("oom_retries", counters.oom_retries);
  for (auto& o : j.observers) o->checkpoint_fields(io);
  io.note("config", resolved_toml(j.config));
  io.note("crucible_version", CRUCIBLE_VERSION);
  io.note("torch_version", compat::torch_version());
}

void Trainer::Impl::save_checkpoint() {
  const auto t0 = Clock::now();
  job->sync_bn_buffers();  // M2
  for (auto& o : job->observers) o->before_checkpoint();
  verify_replicas();
  if (!main_rank()) return;  // law 4: rank 0 writes; the replicas are equal
  CheckpointData data;
  CheckpointIO io = CheckpointIO::writer(data);
  checkpoint_fields(io);
  std::string path;
  try {
    path = dir->checkpoints().save(st.step, data);
  } catch (const Error& e) {
    // A full disk (or any failed write) leaves the checkpoints before this one as they were.
    const std::vector<std::string> kept = dir->checkpoints().list();
    throw runtime_error("the checkpoint of step {} was not written: {}. {}; free space or lower checkpoint.keep "
                        "(now {}), then run the same command again to resume",
                        st.step, e.what(),
                        kept.empty() ? std::string("There is no earlier checkpoint")
                                     : fmt::format("The newest checkpoint, {}, is intact", kept.back()),
                        config.checkpoint.keep);
  }
  const double secs = seconds_since(t0);
  st.train_seconds += secs;  // part of training time, though written before it is counted
  log_info("checkpoint step {} → {} ({:.2f} s)", st.step, path, secs);
  write_report();
}

// The replicas must hold the same weights; a cheap fingerprint per rank is compared at every
// checkpoint so a divergence is caught where it starts, not in a worse model.
void Trainer::Impl::verify_replicas() {
  if (!job->comm) return;
  at::NoGradGuard no_grad;
  at::Tensor fp = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(job->device));
  for (const auto& p : job->params) {
    const at::Tensor d = p.tensor.detach().to(at::kDouble);
    fp[0] += d.sum();
    fp[1] += d.abs().sum();
  }
  const std::vector<double> all = host_values(job->comm->all_gather(fp), HostRead::kReplicas);  // [rank][2]
  for (size_t r = 1; r < static_cast<size_t>(job->world.size); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      throw runtime_error("step {}: rank {} holds different weights from rank 0 (fingerprints {:.17g}/{:.17g} vs "
                          "{:.17g}/{:.17g}); the replicas diverged",
                          st.step, r, all[2 * r], all[2 * r + 1], all[0], all[1]);
    }
  }
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
  job->sync_bn_buffers();  // M2: every rank evaluates with the same statistics
  const EvalResult r = job->evaluator->run();
  st.last_test_loss = r.loss;
  st.last_test_acc = r.acc;
  st.last_test_top5 = r.top5;
  st.last_eval_step = st.step;
  last_eval_figures.clear();
  for (auto& o : job->observers) {
    for (auto& f : o->after_evaluation(st.step, r, *job->evaluator)) last_eval_figures.push_back(std::move(f));
  }
  const double secs = seconds_since(t0);
  st.train_seconds += secs;
  json record = {{"type", "eval"},
                 {"step", st.step},
                 {"epoch", st.epoch + (st.batch_in_epoch == job->steps_per_epoch ? 1 : 0)},
                 {"test_loss", st.last_test_loss},
                 {"test_acc", st.last_test_acc},
                 {"test_top5", st.last_test_top5},
                 {"samples", r.samples},
                 {"seconds", secs},
                 {"train_seconds", st.train_seconds}};
  for (const auto& [name, value] : last_eval_figures) record[name] = value;
  sinks.write(record);
  log_eval(st.step, r, job->comm ? job->world.size : 0, secs);
}

// The one host read of the interval (law 2); under data parallel the sums of every rank.
// Gradient norms are of the averaged gradients, equal on every rank: the sum over ranks / N.
void Trainer::Impl::read_interval(obs::MetricSinks& sinks, double lr, double momentum) {
  const JobConfig& c = job->config;
  IntervalSums& sums = job->step->sums();
  at::Tensor all = at::stack({sums.loss_sum.to(at::kDouble), sums.correct.to(at::kDouble),
                              at::scalar_tensor(static_cast<double>(st.interval_samples),
                                                at::TensorOptions().dtype(at::kDouble).device(job->device)),
                              sums.grad_norm_max.to(at::kDouble), sums.clipped_norm_max.to(at::kDouble)});
  all = at::cat({all, sums.group_norms.to(at::kDouble)});  // T4
  const int64_t ranks_n = job->comm ? job->world.size : 0;
  if (ranks_n > 0) {  // each rank's wait at the gradient sync, in its own slot (the all-reduce sums them)
    at::Tensor waits = at::zeros({ranks_n}, at::TensorOptions().dtype(at::kDouble).device(job->device));
    waits[job->world.rank] = job->step->take_sync_wait();
    all = at::cat({all, waits});
  }
  if (job->comm) job->comm->all_reduce_sum(all);
  const std::vector<double> host = host_values(all, HostRead::kInterval);
  const double samples = std::max(1.0, host[2]);
  const double loss_mean = host[0] / samples;
  const double ranks = job->comm ? static_cast<double>(job->world.size) : 1.0;
  if (!std::isfinite(loss_mean)) {
    throw diverged("training diverged: mean loss over steps {}–{} is {} (lr {:.4g}); the last good checkpoint in {} "
                   "is intact",
                   st.step - c.log.every_steps + 1, st.step, loss_mean, lr, dir->checkpoints().dir());
  }
  if (job->comm) job->clock->lap(Phase::kCommunication);  // the all-reduce above (Gloo waits in it)
  job->clock->lap(Phase::kHostSync);
  count_step_time();
  const double secs = st.interval_seconds;
  json record = {{"type", "train"},
                 {"step", st.step},
                 {"epoch", st.epoch},
                 {"loss", loss_mean},
                 {"acc", host[1] / samples},
                 {"lr", lr},
                 {"momentum", momentum},
                 {"samples_per_s", secs > 0 ? samples / secs : 0},
                 {"samples", st.samples}};
  // T4: each parameter group's update at the interval's last step (replicas equal: sum / N).
  const auto& groups = job->optimizer->groups();
  json update_norm = json::object(), weight_norm = json::object();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string name = groups[g].name.empty() ? fmt::format("group{}", g) : groups[g].name;
    update_norm[name] = host[5 + g] / ranks;
    weight_norm[name] = host[5 + groups.size() + g] / ranks;
  }
  record["update_norm"] = update_norm;
  record["weight_norm"] = weight_norm;
  if (ranks_n > 0) {
    // Stragglers: each rank's wait at the gradient sync, ms per step of the interval.
    const size_t at = 5 + 2 * groups.size();
    const double steps = std::max<int64_t>(1, st.step - interval_first_step);
    json waits = json::array();
    session.sync_wait.resize(static_cast<size_t>(ranks_n), 0.0);
    session.interval_sync_wait.assign(static_cast<size_t>(ranks_n), 0.0);
    session.interval_steps = static_cast<int64_t>(steps);
    for (int64_t r = 0; r < ranks_n; ++r) {
      const double w = host[at + static_cast<size_t>(r)];
      waits.push_back(1e3 * w / steps);
      session.sync_wait[static_cast<size_t>(r)] += w;
      session.interval_sync_wait[static_cast<size_t>(r)] = w;
    }
    record["sync_wait_ms"] = waits;
  }
  interval_first_step = st.step;
  if (c.train.clip_norm > 0) {
    record["grad_norm_max"] = host[3] / ranks;          // before clipping
    record["grad_norm_max_clipped"] = host[4] / ranks;  // what the optimizer saw
  }
  if (job->clock->enabled()) {
    const double busy = job->train_loader->busy_seconds();
    add_interval_breakdown(record, session, *job, secs, busy - interval_loader_busy, st);
    interval_loader_busy = busy;
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
  session.step_seconds += dt;
}

TrainSummary Trainer::Impl::summarize(bool already_complete) {
  TrainSummary s = train_summary(*job, st, session, already_complete);
  s.run_dir = dir->path();
  s.wall_seconds = seconds_since(wall_start);
  json j = summary_json(*job, st, session, s, last_eval_figures);
  if (main_rank()) dir->write_summary(j.dump(2) + "\n");
  if (j["bottleneck"].is_object()) {
    const json& b = j["bottleneck"];
    s.bottleneck = fmt::format("{}: {}: {}", b["verdict"].get<std::string>(), b["evidence"].get<std::string>(),
                               b["fix"].get<std::string>());
  }
  return s;
}

Trainer::Trainer(JobConfig job, TrainFlags flags) : impl_(std::make_unique<Impl>(std::move(job), std::move(flags))) {}
Trainer::~Trainer() = default;

TrainSummary Trainer::run() { return impl_->run(); }

}  // namespace crucible::train
