// The JSON Lines and progress sinks, and the fan-out (see metric_sink.h).
#include "crucible/obs/metric_sink.h"

#include <nlohmann/json.hpp>

namespace crucible::obs {

void JsonlSink::write(const nlohmann::json& record) { writer_.write(record); }

void ProgressSink::write(const nlohmann::json& record) {
  if (record.value("type", std::string()) != "train") return;
  TrainReading r;
  r.step = record.value("step", int64_t{0});
  r.loss = record.value("loss", 0.0);
  r.accuracy = record.value("acc", 0.0);
  r.has_accuracy = record.contains("acc");
  r.lr = record.value("lr", 0.0);
  r.samples_per_s = record.value("samples_per_s", 0.0);
  if (const auto v = record.find("verdict"); v != record.end() && v->is_string()) r.verdict = v->get<std::string>();
  progress_.reading(r, record.value("epoch", int64_t{0}));
}

void MetricSinks::write(const nlohmann::json& record) {
  for (auto& s : sinks_) s->write(record);
}

void MetricSinks::step_done(int64_t step, int64_t epoch) {
  for (auto& s : sinks_) s->step_done(step, epoch);
}

void MetricSinks::histograms(int64_t step, const NamedHistograms& named) {
  for (auto& s : sinks_) s->histograms(step, named);
}

void MetricSinks::checkpoint_written(int64_t step) {
  for (auto& s : sinks_) s->checkpoint_written(step);
}

void MetricSinks::finish(int64_t step) {
  for (auto& s : sinks_) s->finish(step);
}

void MetricSinks::pause() {
  for (auto& s : sinks_) s->pause();
}

}  // namespace crucible::obs
