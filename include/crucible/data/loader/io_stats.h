// D11: what reading a split's samples costs, counted where the reads happen (the pipelines): the
// files read from the source (an image folder's files; a tar shard's, LMDB's or packed set's
// records; an array file's rows), their bytes, the time the loader threads spent reading them,
// and the RAM cache's hits and misses (data.cache). Thread-safe: relaxed atomic counters, read
// as a snapshot. Torch-free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace crucible::data {

struct IoSnapshot {
  int64_t files = 0;          // samples read from the source (not from the RAM cache)
  int64_t bytes = 0;          // their stored (encoded) bytes
  double read_seconds = 0;    // summed over threads: time inside the source's reads
  int64_t cache_hits = 0;     // samples served by the RAM cache
  int64_t cache_misses = 0;   // samples looked up in the RAM cache and read instead
  IoSnapshot operator-(const IoSnapshot& earlier) const;
  // hits / (hits + misses); 0 without lookups.
  double hit_rate() const;
};

class IoCounters {
 public:
  // Counts one read of `bytes` that began at `since`.
  void read(int64_t bytes, std::chrono::steady_clock::time_point since) {
    files_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    read_ns_.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count(),
        std::memory_order_relaxed);
  }
  void cache_hit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  void cache_miss() { misses_.fetch_add(1, std::memory_order_relaxed); }
  IoSnapshot snapshot() const;

 private:
  std::atomic<int64_t> files_{0}, bytes_{0}, read_ns_{0}, hits_{0}, misses_{0};
};

}  // namespace crucible::data
