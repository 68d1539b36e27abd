// Step-time phases and the bottleneck verdict (see breakdown.h).
#include "crucible/obs/breakdown.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace crucible::obs {
namespace {

std::string percent(double share) {
  return fmt::format("{:.0f}%", 100 * share);
}

std::string input_fix(const BottleneckContext& c) {
  const bool saturated = c.loader_busy >= 0.8;
  std::string busy = c.loader_busy >= 0 ? fmt::format("the loader's {} thread(s) were {:.0f}% busy", c.loader_threads,
                                                      100 * std::min(1.0, c.loader_busy))
                                        : fmt::format("the loader used {} thread(s)", c.loader_threads);
  if (!saturated && c.loader_busy >= 0) {
    // Workers idle part of the time, yet the step waited: batches arrive in bursts.
    return fmt::format("{}, so batches come in bursts: raise data.prefetch (now {}) to {}", busy, c.prefetch,
                       std::max<int64_t>(2 * c.prefetch, 8));
  }
  const int spare = c.cores - c.compute_threads - c.loader_threads;
  if (c.dataset == "images" && c.cache != "decoded") {
    const bool fits = c.decoded_cache_gb >= 0 && c.free_memory_gb >= 0 && c.decoded_cache_gb < 0.8 * c.free_memory_gb;
    if (fits) {
      return fmt::format("{} decoding images: set data.cache = \"decoded\" (fits: {:.1f} GB of {:.1f} GB free)", busy,
                         c.decoded_cache_gb, c.free_memory_gb);
    }
    return fmt::format(
        "{} decoding images: pack the data set at training size with `crucible pack --max-side {}` "
        "(decoded it would not fit in memory{})",
        busy, 256,
        c.decoded_cache_gb >= 0 && c.free_memory_gb >= 0
            ? fmt::format(": {:.1f} GB, {:.1f} GB free", c.decoded_cache_gb, c.free_memory_gb)
            : std::string());
  }
  if (spare > 0) {
    return fmt::format("{}: raise data.threads to {} ({} core(s) are idle)", busy, c.loader_threads + spare, spare);
  }
  return fmt::format(
      "{} and every core is in use: set data.threads = {} and train.threads = {} to give the loader a "
      "larger part of the {} cores",
      busy, c.loader_threads + 1, std::max(1, c.compute_threads - 1), c.cores);
}

std::string compute_fix(const BottleneckContext& c) {
  if (c.precision == "fp32" && c.native_bf16) {
    return c.cuda ? "train.precision = \"auto\" times bf16 (and channels_last) against fp32 and keeps the fastest"
                  : "train.precision = \"bf16\": this CPU computes bf16 in hardware";
  }
  if (!c.channels_last) return "try train.channels_last = true (convolutions are often faster in it)";
  if (c.cuda && c.batch_size < 128) {
    return fmt::format("raise train.batch_size (now {}; `crucible tune batch` finds the largest that fits)",
                       c.batch_size);
  }
  return c.cuda ? "nothing else waits: the model's arithmetic is the step; a smaller model or more devices"
                : fmt::format(
                      "nothing else waits: the model's arithmetic is the step; a GPU or more cores would "
                      "help{}",
                      c.native_bf16 ? "" : " (this CPU has no bf16 arithmetic: fp32 is its fastest precision)");
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kDataWait:
      return "data_wait";
    case Phase::kTransfer:
      return "transfer";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kCommunication:
      return "communication";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kHostSync:
      return "host_sync";
    case Phase::kOther:
      return "other";
  }
  return "?";
}

const char* bound_name(Bound bound) {
  switch (bound) {
    case Bound::kInput:
      return "input-bound";
    case Bound::kTransfer:
      return "transfer-bound";
    case Bound::kCompute:
      return "compute-bound";
    case Bound::kCommunication:
      return "communication-bound";
    case Bound::kHostSync:
      return "host-sync-bound";
  }
  return "?";
}

double PhaseSeconds::total() const {
  double t = 0;
  for (double v : s) t += v;
  return t;
}

double PhaseSeconds::share(Phase p) const {
  const double t = total();
  return t > 0 ? (*this)[p] / t : 0;
}

PhaseSeconds& PhaseSeconds::operator+=(const PhaseSeconds& o) {
  for (size_t i = 0; i < s.size(); ++i) s[i] += o.s[i];
  return *this;
}

std::string Bottleneck::to_string() const {
  return fmt::format("{}: {}: {}", verdict(), evidence, fix);
}

Straggler find_straggler(const std::vector<double>& wait, double period_seconds) {
  Straggler s;
  if (wait.size() < 2 || period_seconds <= 0) return s;
  size_t least = 0;
  for (size_t r = 1; r < wait.size(); ++r) least = wait[r] < wait[least] ? r : least;
  double others = 0;
  for (size_t r = 0; r < wait.size(); ++r) others += r == least ? 0 : wait[r];
  others /= static_cast<double>(wait.size() - 1);
  const double late = others - wait[least];
  if (late >= 1e-3 && late >= kStragglerShare * period_seconds) {
    s.rank = static_cast<int>(least);
    s.late_seconds = late;
  }
  return s;
}

Bottleneck diagnose(const PhaseSeconds& seconds, const BottleneckContext& c) {
  const double input = seconds.share(Phase::kDataWait);
  const double transfer = seconds.share(Phase::kTransfer);
  const double compute =
      seconds.share(Phase::kForward) + seconds.share(Phase::kBackward) + seconds.share(Phase::kOptimizer);
  const double comm = seconds.share(Phase::kCommunication);
  const double host = seconds.share(Phase::kHostSync);
  Bottleneck b;
  b.bound = Bound::kCompute;
  b.share = compute;
  for (auto [bound, share] : {std::pair{Bound::kInput, input}, std::pair{Bound::kTransfer, transfer},
                              std::pair{Bound::kCommunication, comm}, std::pair{Bound::kHostSync, host}}) {
    if (share >= kBoundShare && (b.bound == Bound::kCompute || share > b.share)) {
      b.bound = bound;
      b.share = share;
    }
  }
  const double step = seconds.total();
  const Straggler straggler = find_straggler(c.sync_wait, step);
  if (straggler.rank >= 0 && straggler.late_seconds >= kBoundShare * step) {
    b.bound = Bound::kCommunication;
    b.share = straggler.late_seconds / step;
  }
  switch (b.bound) {
    case Bound::kInput:
      b.evidence = fmt::format("{} of step time waiting for data", percent(input));
      b.fix = input_fix(c);
      break;
    case Bound::kTransfer:
      b.evidence = fmt::format("{} of step time moving batches to the device", percent(transfer));
      b.fix = c.cuda ? fmt::format(
                           "raise data.prefetch (now {}) so the next batch's copy overlaps the step; batches "
                           "travel as uint8 and are normalised on the device",
                           c.prefetch)
                     : "the conversion to the model's input is slow: check data.mean/std and the memory format "
                       "(train.channels_last)";
      break;
    case Bound::kCompute:
      b.evidence = fmt::format("{} of step time in forward, backward and the optimizer ({} waiting for data{})",
                               percent(compute), percent(input),
                               c.world_size > 1 ? fmt::format(", {} in communication", percent(comm)) : "");
      b.fix = compute_fix(c);
      break;
    case Bound::kCommunication:
      if (straggler.rank >= 0) {
        b.evidence = fmt::format("the other ranks wait {:.1f} ms per step ({} of the step) at the gradient sync for "
                                 "rank {}, the straggler",
                                 1e3 * straggler.late_seconds / static_cast<double>(std::max<int64_t>(1, c.steps)),
                                 percent(straggler.late_seconds / step), straggler.rank);
        b.fix = fmt::format("find what slows rank {}: its machine (other processes, clock, temperature), its data "
                            "shard or loader, or its device",
                            straggler.rank);
        break;
      }
      b.evidence = fmt::format("{} of the step in gradient communication not overlapped with backward ({} ranks)",
                               percent(comm), c.world_size);
      b.fix = c.accumulate <= 1 ? fmt::format(
                                      "raise dist.bucket_mb (now {:g}) so all-reduces start earlier in backward, or "
                                      "train.accumulate = 2 to communicate once per 2 micro-batches",
                                      c.bucket_mb)
                                : fmt::format("raise dist.bucket_mb (now {:g}) or train.accumulate (now {})",
                                              c.bucket_mb, c.accumulate);
      break;
    case Bound::kHostSync:
      b.evidence = fmt::format("{} of step time with the host waiting on the device ({:.2f} host reads per step)",
                               percent(host), c.host_reads_per_step);
      b.fix = c.sync_debug
                  ? "train.sync_debug = true synchronises every kernel: turn it off for speed"
                  : fmt::format("raise log.every_steps (now {}) so metrics are read less often", c.log_every_steps);
      break;
  }
  return b;
}

}  // namespace crucible::obs
