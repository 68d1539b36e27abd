// IoCounters (see io_stats.h).
#include "crucible/data/loader/io_stats.h"

namespace crucible::data {

IoSnapshot IoSnapshot::operator-(const IoSnapshot& earlier) const {
  IoSnapshot d;
  d.files = files - earlier.files;
  d.bytes = bytes - earlier.bytes;
  d.read_seconds = read_seconds - earlier.read_seconds;
  d.cache_hits = cache_hits - earlier.cache_hits;
  d.cache_misses = cache_misses - earlier.cache_misses;
  return d;
}

double IoSnapshot::hit_rate() const {
  const int64_t lookups = cache_hits + cache_misses;
  return lookups > 0 ? static_cast<double>(cache_hits) / static_cast<double>(lookups) : 0.0;
}

IoSnapshot IoCounters::snapshot() const {
  IoSnapshot s;
  s.files = files_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.read_seconds = static_cast<double>(read_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.cache_hits = hits_.load(std::memory_order_relaxed);
  s.cache_misses = misses_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace crucible::data
