// The metric sinks a run writes to (obs/metric_sink.h), as a registry: metrics.jsonl, the
// progress display, TensorBoard's event files, the HTML report. An entry makes its sink for an
// opened run, or null where the job does not turn it on, and rewinds what earlier sessions of
// the run wrote: on a resume the records past the checkpoint's step go (this session writes
// them again), on a fresh start all of them. Adding a sink is its file in obs/ and one entry in
// sinks.cpp. Rank 0 only (law 4). Built once, then read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "crucible/core/registry.h"
#include "crucible/obs/metric_sink.h"

namespace crucible::train {

struct Job;
class RunDir;

struct SinkContext {
  const Job& job;
  RunDir& dir;
  int64_t step = 0;                  // the step this session starts at
  std::string report_defaults_toml;  // TrainFlags': empty, no report
};

struct SinkEntry {
  std::function<std::unique_ptr<obs::MetricSink>(const SinkContext& context)> make;
  // Drops what earlier sessions wrote past `step` (nullopt: a fresh start, all of it). Called
  // whether or not this session makes the sink: an earlier one may have.
  std::function<void(RunDir& dir, std::optional<int64_t> step)> rewind;
};
const Registry<SinkEntry>& sink_registry();

// Every sink the job turns on, in registration order (none on ranks other than 0).
void make_sinks(const SinkContext& context, obs::MetricSinks& sinks);
// Every entry's rewind (rank 0 only).
void rewind_sinks(const Job& job, RunDir& dir, std::optional<int64_t> step);

// <run>/report.html from the run folder's files: derived, so a failure to write it is a
// warning, not the end of a run. Nothing without defaults (rank 0 only).
void write_report(const Job& job, const RunDir& dir, const std::string& defaults_toml);

}  // namespace crucible::train
