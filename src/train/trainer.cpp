// The training loop (see trainer.h): epochs of steps, evaluation and checkpoints over a Job the
// Session opened (session.h). What a step does is TrainStep's, evaluation is the Evaluator's,
// the checkpoint's contents are listed once (job_checkpoint_fields), the metrics go to the
// sinks (sinks.h), and everything else a recipe adds is a batch transform or a step observer.
#include "crucible/train/trainer.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/core/log.h"
#include "crucible/data/loader/device_feeder.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/model.h"
#include "crucible/obs/layer_profile.h"
#include "crucible/obs/metric_sink.h"
#include "crucible/obs/phase_clock.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/job.h"
#include "crucible/train/loss.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/run_dir.h"
#include "crucible/train/run_state.h"
#include "crucible/train/schedule.h"
#include "crucible/train/session.h"
#include "crucible/train/step.h"
#include "crucible/train/summary.h"

namespace crucible::train {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using obs::Phase;

std::atomic<bool> g_stop{false};


double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The loop over an opened run: it receives the built job, the run's state (restored or fresh),
// this session's record, the checkpoints' folder and the sinks, and runs epochs, steps,
// evaluation and checkpoints until `stop_step`.
class Loop {
 public:
  Loop(Job& job, RunState& st, SessionRecord& record, CheckpointManager& checkpoints, obs::MetricSinks& sinks)
      : job_(job), st_(st), record_(record), checkpoints_(checkpoints), sinks_(sinks) {}
  void run(int64_t stop_step);

 private:
  void run_epochs(int64_t stop_step);
  void train_step(data::FedBatch& fed, const Schedule::Point& sp, bool* stop);
  void save_checkpoint();
  void evaluate();
  void read_interval(double lr, double momentum);
  void count_step_time();

  Job& job_;
  RunState& st_;
  SessionRecord& record_;
  CheckpointManager& checkpoints_;
  obs::MetricSinks& sinks_;
  Clock::time_point step_begin;
  double interval_loader_busy = 0;
  int64_t interval_first_step = 0;  // the step the current log interval began at
};

void Loop::run(int64_t stop_step) {
  g_stop.store(false);
  record_.start(st_.step, job_);
  interval_first_step = st_.step;
  run_epochs(stop_step);
  job_.train_loader->pause_clock();  // a stop inside an epoch: its reads end here (D11)
  sinks_.pause();
  if (st_.last_eval_step != st_.step) {  // stopped by train.max_steps inside an epoch
    evaluate();
    save_checkpoint();
  }
}

// Epochs of steps until `stop_step`: each step timed by phase, the interval's metrics read every
// log.every_steps, a checkpoint every checkpoint.every_steps and at every epoch end (after the
// evaluation). A stop request (SIGINT, any rank) checkpoints and ends the run.
void Loop::run_epochs(int64_t stop_step) {
  const JobConfig& c = job_.config;
  obs::PhaseClock& clock = *job_.clock;
  while (st_.step < stop_step && st_.epoch < c.train.epochs) {
    job_.train_loader->start_epoch(st_.epoch, st_.batch_in_epoch);
    job_.feeder->reset();
    while (st_.step < stop_step) {
      step_begin = Clock::now();
      clock.start();
      std::optional<data::FedBatch> batch = job_.feeder->take([this] { return job_.train_loader->next(); });
      if (!batch) break;
      clock.lap(Phase::kDataWait);
      st_.data_wait_seconds += seconds_since(step_begin);
      const Schedule::Point sp = job_.schedule->at(st_.step);
      bool stop = false;
      train_step(*batch, sp, &stop);
      clock.lap(Phase::kOther);
      if (st_.step % c.log.every_steps == 0) read_interval(sp.lr, sp.momentum);
      clock.lap(Phase::kOther);
      count_step_time();  // the step ends here; evaluation and checkpoints are counted apart
      clock.pause();
      const bool epoch_end = st_.batch_in_epoch == job_.steps_per_epoch;
      if (job_.comm ? stop : g_stop.load()) {
        sinks_.pause();
        save_checkpoint();
        throw runtime_error("interrupted at step {}: checkpoint written; run the same command again to resume",
                            st_.step);
      }
      if (!epoch_end && st_.step % c.checkpoint.every_steps == 0) save_checkpoint();
    }
    if (st_.batch_in_epoch == job_.steps_per_epoch) {
      sinks_.pause();
      evaluate();
      ++st_.epoch;
      st_.batch_in_epoch = 0;
      save_checkpoint();
      // T13: what the epoch's allocations left cached goes back; the memory held after each epoch
      // end is recorded either way, so a creep shows.
      if (c.train.release_cache) record_.released_bytes.push_back(compat::release_cached_memory(job_.device));
      record_.held_bytes_after.push_back(compat::held_memory_bytes(job_.device));
    }
  }
}

// One optimizer step on `batch`: onto the device, through the batch transforms, the step (with
// the gradients handed to the observers that ask for them), then the counters, the sinks and
// the step observers.
void Loop::train_step(data::FedBatch& fed, const Schedule::Point& sp, bool* stop) {
  job_.feeder->hand_over(fed);  // D9: the compute stream waits for the batch's copy
  const data::Batch& batch = fed.host;
  DeviceBatch b{std::move(fed.images), std::move(fed.labels), st_.step, job_.world.rank, batch.epoch,
                batch.sample_ids, batch.copies};
  if (batch.detection) {
    b.image_sizes = batch.image_sizes;
    b.boxes = detection_targets(batch, fed.boxes, fed.box_labels);
  }
  apply_batch_transforms(job_.batch_transforms, b);
  for (auto& o : job_.observers) o->before_step(b);
  job_.clock->lap(Phase::kTransfer);
  std::vector<StepObserver*> want;
  for (auto& o : job_.observers) {
    if (o->wants_gradients(st_.step + 1)) want.push_back(o.get());
  }
  if (!want.empty()) {
    job_.step->before_update = [&want](const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) {
      for (auto* o : want) o->gradients(names, grads);
    };
  }
  if (job_.layer_profiler) job_.layer_profiler->arm();
  const TrainStep::Result r = job_.step->run(b, st_.step, sp.lr, sp.momentum, g_stop.load(), batch.sample_ids);
  if (job_.layer_profiler) job_.layer_profiler->disarm();
  job_.step->before_update = nullptr;
  if (job_.comm) *stop = r.stop_agreed;  // every rank stops at the same step (SIGINT on any rank)
  ++st_.step;
  ++st_.batch_in_epoch;
  st_.samples += batch.size() * job_.world.size;  // global (exact unless the skip policy dropped samples)
  st_.interval_samples += batch.size();
  sinks_.step_done(st_.step, st_.epoch);
  for (auto& o : job_.observers) o->after_update({st_.step, st_.epoch, *job_.model, sinks_, st_.batch_in_epoch});
}

void Loop::save_checkpoint() {
  const auto t0 = Clock::now();
  job_.sync_bn_buffers();  // M2
  for (auto& o : job_.observers) o->before_checkpoint();
  if (job_.comm) {
    std::vector<at::Tensor> params;
    for (const auto& p : job_.params) params.push_back(p.tensor);
    distributed::check_replicas_equal(*job_.comm, params, st_.step);
  }
  if (!job_.main_rank()) return;  // law 4: rank 0 writes; the replicas are equal
  CheckpointData data;
  CheckpointIO io = CheckpointIO::writer(data);
  job_checkpoint_fields(io, job_, st_);
  std::string path;
  try {
    path = checkpoints_.save(st_.step, data);
  } catch (const Error& e) {
    // A full disk (or any failed write) leaves the checkpoints before this one as they were.
    const std::vector<std::string> kept = checkpoints_.list();
    throw runtime_error("the checkpoint of step {} was not written: {}. {}; free space or lower checkpoint.keep "
                        "(now {}), then run the same command again to resume",
                        st_.step, e.what(),
                        kept.empty() ? std::string("There is no earlier checkpoint")
                                     : fmt::format("The newest checkpoint, {}, is intact", kept.back()),
                        job_.config.checkpoint.keep);
  }
  const double secs = seconds_since(t0);
  st_.train_seconds += secs;  // part of training time, though written before it is counted
  log_info("checkpoint step {} → {} ({:.2f} s)", st_.step, path, secs);
  sinks_.checkpoint_written(st_.step);
}

void Loop::evaluate() {
  const auto t0 = Clock::now();
  job_.sync_bn_buffers();  // M2: every rank evaluates with the same statistics
  const EvalResult r = job_.evaluator->run();
  st_.last_test_loss = r.loss;
  st_.last_test_acc = r.acc;
  st_.last_test_top5 = r.top5;
  st_.last_test_coco = r.coco;
  st_.last_eval_step = st_.step;
  record_.last_eval_figures.clear();
  for (auto& o : job_.observers) {
    for (auto& f : o->after_evaluation(st_.step, r, *job_.evaluator)) record_.last_eval_figures.push_back(std::move(f));
  }
  const double secs = seconds_since(t0);
  st_.train_seconds += secs;
  json record = {{"type", "eval"},
                 {"step", st_.step},
                 {"epoch", st_.epoch + (st_.batch_in_epoch == job_.steps_per_epoch ? 1 : 0)}};
  for (const auto& [name, value] : eval_figures(r)) record[name] = value;
  record["samples"] = r.samples;
  record["seconds"] = secs;
  record["train_seconds"] = st_.train_seconds;
  for (const auto& [name, value] : record_.last_eval_figures) record[name] = value;
  sinks_.write(record);
  log_eval(st_.step, r, job_.comm ? job_.world.size : 0, secs);
}

// The one host read of the interval (law 2); under data parallel the sums of every rank.
// Gradient norms are of the averaged gradients, equal on every rank: the sum over ranks / N.
void Loop::read_interval(double lr, double momentum) {
  const JobConfig& c = job_.config;
  IntervalSums& sums = job_.step->sums();
  PackedValues v;
  sums.pack(v);
  v.add("samples", at::scalar_tensor(static_cast<double>(st_.interval_samples),
                                     at::TensorOptions().dtype(at::kDouble).device(job_.device)));
  const int64_t ranks_n = job_.comm ? job_.world.size : 0;
  if (ranks_n > 0) {  // each rank's wait at the gradient sync, in its own slot (the all-reduce sums them)
    at::Tensor waits = at::zeros({ranks_n}, at::TensorOptions().dtype(at::kDouble).device(job_.device));
    waits[job_.world.rank] = job_.step->take_sync_wait();
    v.add("sync_wait", waits);
  }
  if (job_.comm) job_.comm->all_reduce_sum(v.packed());
  v.read(HostRead::kInterval);
  const double samples = std::max(1.0, v.value("samples"));
  const double loss_mean = v.value("loss_sum") / samples;
  const double ranks = job_.comm ? static_cast<double>(job_.world.size) : 1.0;
  if (!std::isfinite(loss_mean)) {
    throw diverged("training diverged: mean loss over steps {}–{} is {} (lr {:.4g}); the last good checkpoint in {} "
                   "is intact",
                   st_.step - c.log.every_steps + 1, st_.step, loss_mean, lr, checkpoints_.dir());
  }
  if (job_.comm) job_.clock->lap(Phase::kCommunication);  // the all-reduce above (Gloo waits in it)
  job_.clock->lap(Phase::kHostSync);
  count_step_time();
  const double secs = st_.interval_seconds;
  json record = {{"type", "train"},
                 {"step", st_.step},
                 {"epoch", st_.epoch},
                 {"loss", loss_mean},
                 {"lr", lr},
                 {"momentum", momentum},
                 {"samples_per_s", secs > 0 ? samples / secs : 0},
                 {"samples", st_.samples}};
  for (const auto& [name, value] : interval_figures(*job_.step, v, samples)) record[name] = value;
  // T4: each parameter group's update at the interval's last step (replicas equal: sum / N).
  const auto& groups = job_.optimizer->groups();
  const std::vector<double> updates = v.values("update_norm"), weights = v.values("weight_norm");
  json update_norm = json::object(), weight_norm = json::object();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string name = groups[g].name.empty() ? fmt::format("group{}", g) : groups[g].name;
    update_norm[name] = updates[g] / ranks;
    weight_norm[name] = weights[g] / ranks;
  }
  record["update_norm"] = update_norm;
  record["weight_norm"] = weight_norm;
  if (ranks_n > 0) {
    // Stragglers: each rank's wait at the gradient sync, ms per step of the interval.
    const std::vector<double> sync_wait = v.values("sync_wait");
    const double steps = std::max<int64_t>(1, st_.step - interval_first_step);
    json waits = json::array();
    record_.sync_wait.resize(static_cast<size_t>(ranks_n), 0.0);
    record_.interval_sync_wait.assign(static_cast<size_t>(ranks_n), 0.0);
    record_.interval_steps = static_cast<int64_t>(steps);
    for (int64_t r = 0; r < ranks_n; ++r) {
      const double w = sync_wait[static_cast<size_t>(r)];
      waits.push_back(1e3 * w / steps);
      record_.sync_wait[static_cast<size_t>(r)] += w;
      record_.interval_sync_wait[static_cast<size_t>(r)] = w;
    }
    record["sync_wait_ms"] = waits;
  }
  interval_first_step = st_.step;
  if (c.train.clip_norm > 0) {
    record["grad_norm_max"] = v.value("grad_norm_max") / ranks;             // before clipping
    record["grad_norm_max_clipped"] = v.value("clipped_norm_max") / ranks;  // what the optimizer saw
  }
  if (job_.clock->enabled()) {
    const double busy = job_.train_loader->busy_seconds();
    add_interval_breakdown(record, record_, job_, secs, busy - interval_loader_busy, st_);
    interval_loader_busy = busy;
  }
  sinks_.write(record);
  sums.zero();
  st_.interval_samples = 0;
  st_.interval_seconds = 0;
}

// The step's time since it began (or since the last count), into the run's step time.
void Loop::count_step_time() {
  const auto now = Clock::now();
  const double dt = std::chrono::duration<double>(now - step_begin).count();
  step_begin = now;
  st_.step_seconds += dt;
  st_.train_seconds += dt;
  st_.interval_seconds += dt;
  record_.step_seconds += dt;
}

}  // namespace

void request_stop() { g_stop.store(true); }

struct Trainer::Impl {
  JobConfig config;
  TrainFlags flags;
};

Trainer::Trainer(JobConfig job, TrainFlags flags) : impl_(std::make_unique<Impl>(Impl{std::move(job), std::move(flags)})) {}
Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  std::unique_ptr<Session> session = Session::open_train(std::move(impl_->config), std::move(impl_->flags));
  if (session->already_complete()) return session->finish(/*trained=*/false);
  Loop(session->job(), session->state(), session->record(), session->dir().checkpoints(), session->sinks())
      .run(session->stop_step());
  return session->finish(/*trained=*/true);
}

}  // namespace crucible::train
