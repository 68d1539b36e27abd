// Where a run's metrics go. The Trainer hands every record (metrics.jsonl's schema: "type" =
// "train" | "eval", "step", "epoch", …) to a MetricSinks fan-out, and each sink renders what it
// needs: JSON Lines, the progress bar, TensorBoard, the report; a new sink is one file and one
// line in the train layer's sink registry (train/sinks.h). Rank 0 only (law 4). Torch-free. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "crucible/obs/jsonl.h"
#include "crucible/obs/progress.h"

namespace crucible::obs {

// A histogram as TensorBoard's HistogramProto holds it: bucket i counts the values in
// (limits[i-1], limits[i]] (the first from `min`).
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> limits, counts;
};
using NamedHistograms = std::vector<std::pair<std::string, Histogram>>;

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  // One record, once per log interval or evaluation (law 2).
  virtual void write(const nlohmann::json& record) = 0;
  // A training step finished (every step: must be cheap).
  virtual void step_done(int64_t step, int64_t epoch) {}
  // Histograms of the weights and gradients (every log.histogram_every steps).
  virtual void histograms(int64_t step, const NamedHistograms& named) {}
  // A checkpoint of `step` was written (the run folder's files are complete up to it).
  virtual void checkpoint_written(int64_t step) {}
  // The run ended at `step` (trained and evaluated); not called when it failed.
  virtual void finish(int64_t step) {}
  // Something else is about to print (evaluation, checkpoint, the end): clear any live display.
  virtual void pause() {}
};

// metrics.jsonl: every record, one JSON object per line, flushed as written.
class JsonlSink final : public MetricSink {
 public:
  explicit JsonlSink(std::string path) : writer_(std::move(path)) {}
  void write(const nlohmann::json& record) override;

 private:
  JsonlWriter writer_;
};

// The progress bar or lines (progress.h): training records become readings.
class ProgressSink final : public MetricSink {
 public:
  ProgressSink(ProgressMode mode, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps)
      : progress_(mode, epochs, steps_per_epoch, total_steps) {}
  void write(const nlohmann::json& record) override;
  void step_done(int64_t step, int64_t epoch) override { progress_.step_done(step, epoch); }
  void pause() override { progress_.clear(); }

 private:
  Progress progress_;
};

// Every sink of a run; empty on ranks other than 0.
class MetricSinks {
 public:
  void add(std::unique_ptr<MetricSink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const nlohmann::json& record);
  void step_done(int64_t step, int64_t epoch);
  void histograms(int64_t step, const NamedHistograms& named);
  void checkpoint_written(int64_t step);
  void finish(int64_t step);
  void pause();
  bool empty() const { return sinks_.empty(); }

 private:
  std::vector<std::unique_ptr<MetricSink>> sinks_;
};

}  // namespace crucible::obs
