// The sink registry (see sinks.h). One entry per sink; the order is the order records reach them.
#include "crucible/train/sinks.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crucible/core/log.h"
#include "crucible/obs/jsonl.h"
#include "crucible/obs/progress.h"
#include "crucible/obs/report.h"
#include "crucible/obs/tensorboard.h"
#include "crucible/train/job.h"
#include "crucible/train/run_dir.h"

namespace crucible::train {
namespace {

namespace fs = std::filesystem;

// The report, rewritten at every checkpoint (the run's end writes it after summary.json).
class ReportSink final : public obs::MetricSink {
 public:
  ReportSink(const Job& job, const RunDir& dir, std::string defaults) : job_(job), dir_(dir), defaults_(std::move(defaults)) {}
  void write(const nlohmann::json&) override {}
  void checkpoint_written(int64_t) override { write_report(job_, dir_, defaults_); }

 private:
  const Job& job_;
  const RunDir& dir_;
  std::string defaults_;
};

}  // namespace

const Registry<SinkEntry>& sink_registry() {
  static const Registry<SinkEntry> registry = [] {
    Registry<SinkEntry> r("sink");
    r.add("jsonl", "metrics.jsonl: every record, one JSON object per line",
          {[](const SinkContext& c) -> std::unique_ptr<obs::MetricSink> {
             return std::make_unique<obs::JsonlSink>(c.dir.metrics_path());
           },
           [](RunDir& dir, std::optional<int64_t> step) {
             if (step) {
               obs::filter_jsonl(dir.metrics_path(),
                                 [&](const nlohmann::json& r) { return r.value("step", int64_t{0}) <= *step; });
             } else {
               std::error_code ec;
               fs::remove(dir.metrics_path(), ec);
             }
           }});
    r.add("progress", "log.progress: the progress bar or lines",
          {[](const SinkContext& c) -> std::unique_ptr<obs::MetricSink> {
             return std::make_unique<obs::ProgressSink>(
                 obs::parse_progress_mode(c.job.config.log.progress, stdout_is_terminal()), c.job.config.train.epochs,
                 c.job.steps_per_epoch, c.job.total_steps);
           },
           [](RunDir&, std::optional<int64_t>) {}});
    r.add("tensorboard", "log.tensorboard: TensorBoard event files in <run>/tb",
          {[](const SinkContext& c) -> std::unique_ptr<obs::MetricSink> {
             if (!c.job.config.log.tensorboard) return nullptr;
             return std::make_unique<obs::TensorBoardSink>(c.dir.tensorboard_dir(), c.step, resolved_toml(c.job.config),
                                                           hyperparameters(c.job.config));
           },
           [](RunDir& dir, std::optional<int64_t> step) {
             if (step) {
               obs::truncate_events(dir.tensorboard_dir(), *step);
             } else {
               std::error_code ec;
               fs::remove_all(dir.tensorboard_dir(), ec);
             }
           }});
    r.add("report", "report.html, rewritten at every checkpoint and at the end",
          {[](const SinkContext& c) -> std::unique_ptr<obs::MetricSink> {
             if (c.report_defaults_toml.empty()) return nullptr;
             return std::make_unique<ReportSink>(c.job, c.dir, c.report_defaults_toml);
           },
           [](RunDir&, std::optional<int64_t>) {}});
    return r;
  }();
  return registry;
}

void make_sinks(const SinkContext& context, obs::MetricSinks& sinks) {
  if (!context.job.main_rank()) return;  // law 4: rank 0 writes the metrics and draws progress (X6, X7)
  for (const auto& e : sink_registry().entries()) {
    if (auto s = e.factory.make(context)) sinks.add(std::move(s));
  }
}

void rewind_sinks(const Job& job, RunDir& dir, std::optional<int64_t> step) {
  if (!job.main_rank()) return;
  for (const auto& e : sink_registry().entries()) e.factory.rewind(dir, step);
}

void write_report(const Job& job, const RunDir& dir, const std::string& defaults_toml) {
  if (!job.main_rank() || defaults_toml.empty()) return;
  try {
    obs::write_run_report(dir.path(), defaults_toml);
  } catch (const std::exception& e) {
    log_warn("{}/report.html not written: {}", dir.path(), e.what());
  }
}

}  // namespace crucible::train
