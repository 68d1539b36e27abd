// TensorBoard event files: runs/<name>/tb/events.out.tfevents.<time>.<host>.<pid>.<n>, written by
// rank 0 (law 4) so that `tensorboard --logdir runs` shows a run's curves, its config and the
// histograms of its weights and gradients.
//
// Format (reference/models-observability-python.md): TFRecord framing — uint64 length (LE),
// uint32 masked CRC-32C of the length, the bytes, uint32 masked CRC-32C of the bytes — around
// serialized `Event` protobufs (tensorflow/core/util/event.proto, summary.proto). The first
// event carries file_version "brain.Event:2".
// Hand-written: Debian 12 packages no C++ CRC-32C library, and libprotobuf would need a protoc
// step and generated code for the eight fields used here.
// Torch-free. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "crucible/obs/metric_sink.h"

namespace crucible::obs {

// CRC-32C (Castagnoli), continuing from `crc` (0 to start), and TFRecord's masked form.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

// One event file, appended record by record and flushed at each flush() (once per log
// interval: law 2). A new writer never appends to an existing file: it starts its own.
class EventWriter {
 public:
  // Creates `dir` if needed and a new events file in it.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value, double wall_time);
  // A text summary (TensorBoard's Text tab renders it as Markdown).
  void text(const std::string& tag, int64_t step, const std::string& text, double wall_time);
  void histogram(const std::string& tag, int64_t step, const Histogram& h, double wall_time);
  // TensorBoard's HParams tab (tensorboard/plugins/hparams/plugin_data.proto): the experiment
  // (hyperparameter names, the metric tags to show) and this session's start with its values
  // (TOML value text: numbers, true/false and "strings" become typed values, lists strings).
  void hparams_start(const std::vector<std::pair<std::string, std::string>>& hparams,
                     const std::vector<std::string>& metric_tags, int64_t step, double wall_time);
  // The session ended successfully at `step`.
  void hparams_end(int64_t step, double wall_time);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::string path_;
  int fd_ = -1;
  std::string pending_;  // records since the last flush, appended whole by it (append_whole)
};

// The records of an event file, each CRC-checked. A torn record at the end (a crash mid-write)
// ends the list; a record whose CRC does not match throws bad_input naming the file and offset.
std::vector<std::string> read_event_records(const std::string& path, bool* torn = nullptr);

// The step of a serialized Event (0 when absent, as protobuf's default).
int64_t event_step(const std::string& event);

// On resume: rewrites every event file in `dir` atomically, keeping the file-version event and
// the events at steps <= `last_step`, so that the resumed session's events are not doubled (as
// filter_jsonl does for metrics.jsonl). Files left with nothing but the version are removed.
void truncate_events(const std::string& dir, int64_t last_step);

// The sink: every number of a metrics record becomes a scalar tagged "<type>/<key>" ("train/loss",
// "eval/test_acc", …) at the record's step; the resolved config is written once, as text, and
// the hyperparameters (`hparams`: (key, TOML value)) with the evaluation metrics, when the sink
// starts; the session's end at finish(); histograms come from histograms().
class TensorBoardSink final : public MetricSink {
 public:
  TensorBoardSink(const std::string& dir, int64_t start_step, const std::string& config_toml,
                  const std::vector<std::pair<std::string, std::string>>& hparams);
  void write(const nlohmann::json& record) override;
  void histograms(int64_t step, const NamedHistograms& named) override;
  void finish(int64_t step) override;

 private:
  EventWriter writer_;
};

}  // namespace crucible::obs
