// tune_host_allocator: glibc mallopt (no other allocator needed; tcmalloc measured the same).
// physical_memory_bytes: sysconf. MemoryBudget: a running total checked before each allocation.
#include "crucible/core/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>  // defines __GLIBC__ on glibc systems
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "crucible/core/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace crucible {

bool tune_host_allocator() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit; setting it also stops the dynamic
  // threshold from drifting. The trim threshold keeps freed memory for the next step.
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

uint64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? resident * static_cast<uint64_t>(page) : 0;
}

int64_t release_freed_host_memory() {
#if defined(__GLIBC__)
  const auto before = static_cast<int64_t>(resident_memory_bytes());
  malloc_trim(0);
  return std::max<int64_t>(0, before - static_cast<int64_t>(resident_memory_bytes()));
#else
  return 0;
#endif
}

bool cpuinfo_has_native_bf16(const std::string& cpuinfo, std::string* found) {
  std::istringstream lines(cpuinfo);
  for (std::string line; std::getline(lines, line);) {
    // x86 "flags : …", Arm "Features : …"
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1));
    for (std::string w; words >> w;) {
      if (w == "avx512_bf16" || w == "amx_bf16" || w == "bf16") {
        if (found != nullptr) *found = w;
        return true;
      }
    }
  }
  if (found != nullptr) found->clear();
  return false;
}

bool cpu_has_native_bf16(std::string* found) {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return cpuinfo_has_native_bf16(text.str(), found);
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t default_memory_budget() {
  const uint64_t phys = physical_memory_bytes();
  return phys > 0 ? phys / 2 : uint64_t{4} << 30;
}

std::string human_bytes(uint64_t b) {
  constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  if (b < 10 * kKiB) return fmt::format("{} bytes", b);
  if (b < 10 * kMiB) return fmt::format("{} KiB", (b + kKiB / 2) / kKiB);
  if (b < kGiB) return fmt::format("{:.1f} MiB", static_cast<double>(b) / kMiB);
  return fmt::format("{:.1f} GiB", static_cast<double>(b) / kGiB);
}

MemoryBudget::MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes != 0 ? limit_bytes : default_memory_budget()) {}

void MemoryBudget::take(uint64_t bytes, uint64_t compressed_bytes, const std::string& what) {
  if (bytes <= limit_ && used_ <= limit_ - bytes) {
    used_ += bytes;
    return;
  }
  const std::string earlier =
      used_ > 0 ? fmt::format(" with {} bytes already inflated by this read", used_) : std::string();
  throw bad_input("{} inflates to {} bytes ({}) from {} compressed, over the memory budget of {} bytes ({}){}; raise "
                  "it with --memory-budget-mb",
                  what, bytes, human_bytes(bytes), human_bytes(compressed_bytes), limit_, human_bytes(limit_), earlier);
}

}  // namespace crucible
