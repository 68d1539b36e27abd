// Where a training step's time goes, and what limits it (PITFALLS T6, T12, X6).
// - Phase / PhaseSeconds: a step's time split into contiguous phases (data wait, host→device
//   transfer, forward, backward, the gradient communication not overlapped with backward, the
//   optimizer, host reads, and the loop's own bookkeeping); a PhaseClock (phase_clock.h)
//   measures them, checkpoints and evaluation are counted apart.
// - diagnose(): the bottleneck verdict — input-, transfer-, compute-, communication- or
//   host-sync-bound — with its evidence (the shares) and the one change most likely to help,
//   taken from what the run knows about its own settings.
// Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::obs {

enum class Phase {
  kDataWait,       // the loader did not have the next batch
  kTransfer,       // the batch to the device: copy, layout, normalisation
  kForward,        // forward and loss (every micro-batch)
  kBackward,       // backward (gradient all-reduce that overlaps it is inside)
  kCommunication,  // collectives the step waited for: the rest of the gradient sync, the step's vote, the interval
                   // read's
  kOptimizer,      // unscale, clipping, the update, zeroing gradients
  kHostSync,       // the host waiting to read device values (the step's finiteness vote, the interval's metrics)
  kOther,          // the loop's own bookkeeping (progress, metrics records, histograms)
};
constexpr int kPhases = 8;
const char* phase_name(Phase phase);  // "data_wait", "transfer", … (metrics.jsonl keys)

struct PhaseSeconds {
  std::array<double, kPhases> s{};
  double& operator[](Phase p) { return s[static_cast<size_t>(p)]; }
  double operator[](Phase p) const { return s[static_cast<size_t>(p)]; }
  double total() const;
  double share(Phase p) const;  // of total(); 0 when nothing was measured
  PhaseSeconds& operator+=(const PhaseSeconds& o);
};

// The five verdicts; each groups phases (compute = forward + backward + optimizer; bookkeeping
// counts toward none).
enum class Bound { kInput, kTransfer, kCompute, kCommunication, kHostSync };
const char* bound_name(Bound bound);  // "input-bound", …

// What the run knows that picks the fix.
struct BottleneckContext {
  // The data (D1, D10): dataset kind, its loader's threads and how busy they were.
  std::string dataset = "idx";  // data.dataset: "idx" | "arrays" | "images"
  int loader_threads = 1;
  double loader_busy = -1;  // worker time building batches / (threads × wall time); -1 unknown
  int64_t prefetch = 4;
  std::string cache = "none";    // data.cache
  double decoded_cache_gb = -1;  // what data.cache = "decoded" would hold; -1 unknown
  double free_memory_gb = -1;    // available memory
  int cores = 1;                 // cores this process may use
  int compute_threads = 1;       // torch's intra-op threads
  // The device and precision.
  bool cuda = false;
  std::string precision = "bf16";  // "fp32" | "bf16" | "fp16"
  bool native_bf16 = true;         // the device computes bf16 in hardware (a GPU; a CPU with avx512_bf16/amx)
  bool channels_last = true;
  int64_t batch_size = 256;
  // Data parallel.
  int world_size = 1;
  double bucket_mb = 25;
  int64_t accumulate = 1;
  // Each rank's wait at the gradient sync over the steps diagnosed, in seconds (empty in one
  // process): the rank that waits least is the one the others wait for (find_straggler).
  std::vector<double> sync_wait;
  int64_t steps = 1;  // the steps the phases and waits cover
  // Host reads.
  double host_reads_per_step = 1;
  int64_t log_every_steps = 50;
  bool sync_debug = false;
};

struct Bottleneck {
  Bound bound = Bound::kCompute;
  double share = 0;      // the verdict's share of step time
  std::string evidence;  // "41% of step time waiting for data; …"
  std::string fix;       // the one change most likely to help
  std::string verdict() const { return bound_name(bound); }
  std::string to_string() const;  // "input-bound: <evidence>: <fix>"
};

// A non-compute group that takes at least this share of the step is the bottleneck (the largest
// such one); below it, the step is compute-bound: removing the rest would not gain a fifth.
constexpr double kBoundShare = 0.20;

// A straggler: the rank the others wait for at the gradient sync, and how much later than them
// it arrives (the others' mean wait less its own), over the same period as the waits.
struct Straggler {
  int rank = -1;          // -1: none
  double late_seconds = 0;
};
// From each rank's wait over a period of `period_seconds` of step time: the rank that waits
// least, when the others wait longer by at least kStragglerShare of the period (and 1 ms);
// else none.
Straggler find_straggler(const std::vector<double>& wait, double period_seconds);
constexpr double kStragglerShare = 0.10;

// The verdict. With a straggler whose lateness is at least kBoundShare of the step, the step is
// communication-bound whatever this rank's own phases say, and the verdict names that rank.
Bottleneck diagnose(const PhaseSeconds& seconds, const BottleneckContext& context);

}  // namespace crucible::obs
