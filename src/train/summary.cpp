// A run's report of itself (see summary.h).
#include "crucible/data/eval/coco_eval.h"
#include "crucible/train/summary.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/loader/device_feeder.h"
#include "crucible/data/loader/loader.h"
#include "crucible/obs/layer_profile.h"
#include "crucible/obs/phase_clock.h"
#include "crucible/train/job.h"
#include "crucible/train/run_state.h"
#include "crucible/train/step.h"

#ifndef CRUCIBLE_VERSION
#define CRUCIBLE_VERSION "0.0.0"
#endif

namespace crucible::train {
namespace {

using json = nlohmann::json;

// What the bottleneck verdict weighs besides the phases: the loader, the machine, the job.
obs::BottleneckContext bottleneck_context(const Job& job, const SessionRecord& session, const RunState& st,
                                          double loader_busy_seconds, double step_seconds) {
  const JobConfig& cfg = job.config;
  obs::BottleneckContext c;
  c.dataset = cfg.data.dataset == DataSection::Dataset::kIdx         ? "idx"
              : cfg.data.dataset == DataSection::Dataset::kArrays    ? "arrays"
              : cfg.data.dataset == DataSection::Dataset::kDetection ? "detection"
                                                                     : "images";
  c.loader_threads = job.loader_threads;
  c.loader_busy = step_seconds > 0 ? loader_busy_seconds / (job.loader_threads * step_seconds) : -1;
  c.prefetch = cfg.data.prefetch;
  c.cache = data::cache_mode_name(cfg.data.cache);
  const data::SamplePipeline& train = job.train_loader->pipeline();
  c.decoded_cache_gb = static_cast<double>(train.size()) * static_cast<double>(train.output_spec().bytes()) / 1e9;
  c.free_memory_gb = static_cast<double>(available_memory_bytes()) / 1e9;
  c.cores = std::max(1, available_cores() / std::max(1, job.world.local_size));
  c.compute_threads = compat::num_threads();
  c.cuda = job.device.is_cuda();
  c.precision = job.precision.value.dtype_name();
  c.native_bf16 = job.device.is_cuda() || job.cpu_bf16;
  c.channels_last = job.precision.value.channels_last;
  c.batch_size = cfg.train.batch_size;
  c.world_size = job.world.size;
  c.bucket_mb = cfg.dist.bucket_mb;
  c.accumulate = cfg.train.accumulate;
  int64_t reads = 0;
  for (int64_t n : session.host_reads()) reads += n;
  c.host_reads_per_step = st.step > session.first_step
                              ? static_cast<double>(reads) / static_cast<double>(st.step - session.first_step)
                              : 1;
  c.log_every_steps = cfg.log.every_steps;
  c.sync_wait = session.sync_wait;  // the session's; an interval's verdict gives its own
  c.steps = std::max<int64_t>(1, st.step - session.first_step);
  c.sync_debug = cfg.train.sync_debug;
  return c;
}

// This session's phases and shares, and the verdict over them (null without steps or clock).
void session_breakdown(const Job& job, const RunState& st, const SessionRecord& session, json* breakdown,
                       json* bottleneck) {
  const int64_t steps = st.step - session.first_step;
  if (!job.clock->enabled() || steps <= 0 || session.step_seconds <= 0) return;
  json phases = json::object(), shares = json::object();
  for (int i = 0; i < obs::kPhases; ++i) {
    const auto p = static_cast<obs::Phase>(i);
    phases[obs::phase_name(p)] = session.phases[p];
    shares[obs::phase_name(p)] = session.phases[p] / session.step_seconds;
  }
  *breakdown = {{"step_seconds", session.step_seconds},
                {"phases", phases},
                {"shares", shares},
                {"checkpoint_eval_seconds", st.train_seconds - st.step_seconds},
                {"steps", steps}};
  const obs::Bottleneck b =
      obs::diagnose(session.phases, bottleneck_context(job, session, st, session.loader_busy, session.step_seconds));
  *bottleneck = {{"verdict", b.verdict()}, {"share", b.share}, {"evidence", b.evidence}, {"fix", b.fix}};
  // Data parallel: each rank's wait at the gradient sync, and the rank the others wait for.
  if (!session.sync_wait.empty()) {
    json waits = json::array();
    for (double w : session.sync_wait) waits.push_back(1e3 * w / static_cast<double>(steps));
    (*bottleneck)["sync_wait_ms"] = waits;  // per step
    const obs::Straggler s = obs::find_straggler(session.sync_wait, session.phases.total());
    (*bottleneck)["straggler"] =
        s.rank >= 0 ? json{{"rank", s.rank}, {"late_ms", 1e3 * s.late_seconds / static_cast<double>(steps)}}
                    : json(nullptr);
  }
}

// train.profile = "full": each layer's forward and backward, per step of this session (null
// otherwise); rank 0 logs them.
json layer_times(const Job& job, const RunState& st, const SessionRecord& session) {
  const int64_t steps = st.step - session.first_step;
  if (!job.layer_profiler || steps <= 0) return nullptr;
  json layers = json::array();
  for (const obs::LayerTime& l : job.layer_profiler->layers()) {
    const double total = l.forward_seconds + l.backward_seconds;
    layers.push_back({{"name", l.name},
                      {"forward_seconds", l.forward_seconds},
                      {"backward_seconds", l.backward_seconds},
                      {"forward_ms_per_step", 1e3 * l.forward_seconds / steps},
                      {"backward_ms_per_step", 1e3 * l.backward_seconds / steps},
                      {"share", session.step_seconds > 0 ? total / session.step_seconds : 0.0}});
  }
  if (job.main_rank()) {
    std::vector<std::string> parts;
    for (const auto& l : layers) {
      parts.push_back(fmt::format("{} {:.1f}+{:.1f} ms ({:.0f}%)", l["name"].get<std::string>(),
                                  l["forward_ms_per_step"].get<double>(), l["backward_ms_per_step"].get<double>(),
                                  100 * l["share"].get<double>()));
    }
    log_info("time by layer a step, forward+backward: {}", fmt::join(parts, ", "));
  }
  return layers;
}

// T6: this session's host reads in the training loop, by reason.
json host_reads_json(const SessionRecord& session, int64_t* total) {
  json out = json::object();
  *total = 0;
  const auto n = session.host_reads();
  for (int i = 0; i < kHostReadReasons; ++i) {
    out[host_read_name(static_cast<HostRead>(i))] = n[static_cast<size_t>(i)];
    *total += n[static_cast<size_t>(i)];
  }
  return out;
}

}  // namespace

void SessionRecord::start(int64_t step, const Job& job) {
  host_reads_at_start = host_read_counts();
  first_step = step;
  const data::Loader* loaders[2] = {job.train_loader.get(), job.test_loader.get()};
  for (size_t i = 0; i < 2; ++i) {
    io_at_start[i] = loaders[i]->pipeline().io();
    serving_at_start[i] = loaders[i]->active_seconds();
  }
}

// Remote shards (issue 37): requests, retries, the node's shard cache; null for local data.
json remote_json(const data::SamplePipeline& p) {
  data::RemoteIo r;
  if (!p.remote_io(&r)) return nullptr;
  return {{"requests", r.requests},       {"retries", r.retries},     {"bytes", r.bytes},
          {"downloads", r.downloads},     {"cache_hits", r.hits},     {"evictions", r.evictions},
          {"failed_checks", r.failed_checks}, {"cache_dir", r.cache_dir}, {"cache_used_bytes", r.cache_used_bytes},
          {"cache_bytes", r.cache_max_bytes}};
}

json io_json(const Job& job, const SessionRecord& session) {
  json out = json::object();
  const data::Loader* loaders[2] = {job.train_loader.get(), job.test_loader.get()};
  for (size_t i = 0; i < 2; ++i) {
    const data::SamplePipeline& p = loaders[i]->pipeline();
    const data::IoSnapshot io = p.io() - session.io_at_start[i];
    const double seconds = loaders[i]->active_seconds() - session.serving_at_start[i];
    const auto per_s = [&](double n) { return seconds > 0 ? json(n / seconds) : json(nullptr); };
    json cache = nullptr;
    if (std::string(p.cache_name()) != "none") {
      cache = {{"mode", p.cache_name()},
               {"hits", io.cache_hits},
               {"misses", io.cache_misses},
               {"hit_rate", io.cache_hits + io.cache_misses > 0 ? json(io.hit_rate()) : json(nullptr)},
               {"held_bytes", p.cache_held_bytes()},
               {"budget_bytes", p.cache_budget_bytes()}};
    }
    out[i == 0 ? "train" : "test"] = {
        {"files", io.files},
        {"bytes", io.bytes},
        {"seconds", seconds},
        {"files_per_s", per_s(static_cast<double>(io.files))},
        {"bytes_per_s", per_s(static_cast<double>(io.bytes))},
        {"read_seconds", io.read_seconds},
        {"ms_per_file", io.files > 0 ? json(1e3 * io.read_seconds / static_cast<double>(io.files)) : json(nullptr)},
        {"cache", cache},
        {"remote", remote_json(p)}};
  }
  return out;
}

std::array<int64_t, kHostReadReasons> SessionRecord::host_reads() const {
  auto n = host_read_counts();
  for (size_t i = 0; i < n.size(); ++i) n[i] -= host_reads_at_start[i];
  return n;
}

void add_interval_breakdown(json& record, SessionRecord& session, const Job& job, double interval_seconds,
                            double loader_busy_seconds, const RunState& st) {
  // Each phase's share of the interval's measured step time (they add up to it within clock
  // jitter on CPU; on CUDA the device timeline is measured against the host's).
  const obs::PhaseSeconds phases = job.clock->take();
  session.phases += phases;
  json shares = json::object();
  for (int i = 0; i < obs::kPhases; ++i) {
    const auto p = static_cast<obs::Phase>(i);
    shares[obs::phase_name(p)] = interval_seconds > 0 ? phases[p] / interval_seconds : 0.0;
  }
  record["step_seconds"] = interval_seconds;
  record["breakdown"] = shares;
  obs::BottleneckContext context = bottleneck_context(job, session, st, loader_busy_seconds, interval_seconds);
  context.sync_wait = session.interval_sync_wait;
  context.steps = session.interval_steps;
  const obs::Bottleneck b = obs::diagnose(phases, context);
  record["verdict"] = b.verdict();
  record["verdict_share"] = b.share;
}

TrainSummary train_summary(Job& job, const RunState& st, const SessionRecord& session, bool already_complete) {
  TrainSummary s;
  s.test_acc = st.last_test_acc;
  s.test_top5 = st.last_test_top5;
  s.test_loss = st.last_test_loss;
  s.test_coco = st.last_test_coco;
  s.train_seconds = st.train_seconds;
  s.samples_per_s = st.step_seconds > 0 ? static_cast<double>(st.samples) / st.step_seconds : 0;
  s.steps = st.step;
  s.params_sha256 = params_sha256(*job.model);
  s.already_complete = already_complete;
  s.precision = job.precision;
  const MicroBatchRecord& ran = job.step->ran();
  const bool stepped = ran.logits_dtype != c10::ScalarType::Undefined;
  s.step_dtype = stepped ? c10::toString(ran.logits_dtype) : "";
  s.step_channels_last = ran.channels_last;
  s.loss_scale_tracker = job.scaler.growth_tracker();
  return s;
}

// crucible launch's list of why it restarted the group ([] when it did not, or under torchrun).
json restart_causes(const std::string& text) {
  if (text.empty()) return json::array();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? json(text) : j;
}

json summary_json(Job& job, const RunState& st, SessionRecord& session, const TrainSummary& s,
                  const EvalFigures& eval_figures) {
  json timed = json::array();
  for (const auto& t : job.precision.timed) {
    timed.push_back({{"precision", t.precision.dtype_name()},
                     {"memory_format", t.precision.memory_format_name()},
                     {"ms", t.ms}});
  }
  int64_t reads = 0;
  const json host_reads = host_reads_json(session, &reads);
  const int64_t session_steps = st.step - session.first_step;
  const compat::Tf32 tf32 = compat::tf32_in_effect();  // T5, read back from torch
  session.phases += job.clock->take();  // the steps after the last log interval
  json breakdown = nullptr, bottleneck = nullptr;
  session_breakdown(job, st, session, &breakdown, &bottleneck);
  json skipped = json::array();
  for (const auto* l : {job.train_loader.get(), job.test_loader.get()}) {
    for (const auto& name : l->skipped_names()) skipped.push_back(name);
  }
  const StepCounters& c = job.step->counters();
  const bool stepped = !s.step_dtype.empty();
  const bool coco = !s.test_coco.empty();  // a detector's numbers replace the classifier's
  json j = {{"test_acc", coco ? json(nullptr) : json(s.test_acc)},
            {"test_top5", coco ? json(nullptr) : json(s.test_top5)},
            {"test_loss", coco ? json(nullptr) : json(s.test_loss)},
            {"train_seconds", s.train_seconds},
            {"step_seconds", st.step_seconds},
            {"eval_seconds", st.train_seconds - st.step_seconds},
            {"data_wait_seconds", st.data_wait_seconds},
            {"feeder", json{{"ahead", job.feeder->ahead()}, {"most_ahead", job.feeder->most_ahead()}}},  // D9
            {"wall_seconds", s.wall_seconds},
            {"samples_per_s", s.samples_per_s},
            {"samples", st.samples},
            {"bad_samples_skipped", job.train_loader->skipped_count() + job.test_loader->skipped_count()},
            {"skipped_samples", skipped},
            {"io", io_json(job, session)},  // D11
            {"device_peak_bytes", compat::device_peak_bytes(job.device)},  // the GPU allocator's peak; 0 on CPU
            {"epoch_end_memory", json{{"release", job.config.train.release_cache},  // T13
                                      {"released_bytes", session.released_bytes},
                                      {"held_bytes", session.held_bytes_after}}},
            {"doctor", job.doctor_json.empty() ? json(nullptr) : json::parse(job.doctor_json)},
            {"breakdown", breakdown},
            {"bottleneck", bottleneck},
            {"layers", layer_times(job, st, session)},
            {"steps", st.step},
            {"epochs", job.config.train.epochs},
            {"precision", job.precision.value.dtype_name()},
            {"memory_format", job.precision.value.memory_format_name()},
            {"precision_source", job.precision.source},
            {"precision_timed", timed},
            {"step_dtype", stepped ? json(s.step_dtype) : json(nullptr)},
            {"step_channels_last", stepped ? json(s.step_channels_last) : json(nullptr)},
            {"skipped_steps", c.skipped_steps},
            {"oom_retries", c.oom_retries},
            {"host_reads", host_reads},
            {"host_reads_per_step", session_steps > 0 ? json(static_cast<double>(reads) / session_steps) : json(nullptr)},
            {"loss_scale", job.scaler.enabled() ? json(job.scaler.scale()) : json(nullptr)},
            {"loss_scale_growth_tracker", job.scaler.enabled() ? json(job.scaler.growth_tracker()) : json(nullptr)},
            {"threads", compat::num_threads()},
            {"matmul_precision", compat::matmul_precision()},  // T5, read back from torch
            {"tf32", json{{"matmul", tf32.matmul}, {"conv", tf32.conv}}},
            {"cudnn_benchmark", compat::cudnn_benchmark()},    // T9, read back from torch
            {"world_size", job.world.size},
            {"restarts", job.world.restarts},  // crucible launch / torchrun --max-restarts
            {"restart_causes", restart_causes(job.world.restart_causes)},
            {"seed", job.config.run.seed},
            {"model", job.config.model.name},
            {"loss", job.config.loss.name},
            {"params_sha256", s.params_sha256},
            {"resumed_from_step", session.resumed_from ? json(*session.resumed_from) : json(nullptr)},
            {"torch_version", compat::torch_version()},
            {"crucible_version", CRUCIBLE_VERSION}};
  for (size_t k = 0; k < s.test_coco.size(); ++k) j[std::string("test_") + data::coco_stat_names()[k]] = s.test_coco[k];
  if (job.detection) j["loss"] = "detector";  // the loss dict, not [loss]
  for (const auto& [name, value] : eval_figures) j[name] = value;
  for (auto& o : job.observers) o->summary_fields(j);
  return j;
}

}  // namespace crucible::train
