// What a run reports about itself, apart from the loop: this session's record (host reads by
// reason, phase times, step time), the interval breakdown a metrics record carries, and the
// end-of-run TrainSummary and summary.json. Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include <nlohmann/json_fwd.hpp>

#include "crucible/core/host_read.h"
#include "crucible/data/loader/io_stats.h"
#include "crucible/obs/breakdown.h"
#include "crucible/train/step_observer.h"
#include "crucible/train/trainer.h"

namespace crucible::train {

struct Job;
struct RunState;

// This session of a run (a resumed run's earlier sessions are in metrics.jsonl).
struct SessionRecord {
  std::array<int64_t, kHostReadReasons> host_reads_at_start{};  // T6: counts when the loop began
  int64_t first_step = 0;                                       // the loop's first step
  std::optional<int64_t> resumed_from;                          // the checkpoint's step
  obs::PhaseSeconds phases;                                     // measured phases of the steps
  double step_seconds = 0;                                      // measured step time
  double loader_busy = 0;                                       // the training loader's busy seconds at the end
  std::vector<double> sync_wait;  // each rank's seconds waiting at the gradient sync (data parallel)
  std::vector<double> interval_sync_wait;  // … in the last log interval
  int64_t interval_steps = 1;              // the steps of the last log interval
  // D11: each split's reads and serving time when the loop began (assembly's thread
  // measurement and doctor checks read samples too); index 0 train, 1 test.
  std::array<data::IoSnapshot, 2> io_at_start{};
  std::array<double, 2> serving_at_start{};
  // T13: what each epoch-end release gave back (train.release_cache), and the memory this process
  // held on the device after each epoch end (compat::held_memory_bytes: the CPU's resident set).
  std::vector<int64_t> released_bytes;
  std::vector<int64_t> held_bytes_after;
  EvalFigures last_eval_figures;  // the step observers' figures of the last evaluation

  void start(int64_t step, const Job& job);  // the loop begins at `step`
  std::array<int64_t, kHostReadReasons> host_reads() const;  // since start(), by reason
};

// Adds the interval's breakdown (each phase's share of `interval_seconds`, from the job's
// clock), its verdict and share to a "train" record; the phases go into `session` too.
void add_interval_breakdown(nlohmann::json& record, SessionRecord& session, const Job& job, double interval_seconds,
                            double loader_busy_seconds, const RunState& st);

// D11: this session's reads of each split ({"train": …, "test": …}): files and bytes read and
// their rates over the loader's serving time, the time in reads, the RAM cache's hits.
nlohmann::json io_json(const Job& job, const SessionRecord& session);

// The TrainSummary's figures (run_dir, wall_seconds and bottleneck are the caller's).
TrainSummary train_summary(Job& job, const RunState& st, const SessionRecord& session, bool already_complete);

// summary.json: `s`'s figures with this session's breakdown, verdict, layer times, host reads
// and the observers' last evaluation figures and summary fields. Takes the clock's remaining
// phases into `session`.
nlohmann::json summary_json(Job& job, const RunState& st, SessionRecord& session, const TrainSummary& s,
                            const EvalFigures& eval_figures);

}  // namespace crucible::train
