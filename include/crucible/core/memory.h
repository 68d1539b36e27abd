// Host memory: allocator settings for training, the physical memory size, and the budget
// that bounds what one read inflates from compressed archives (issue 10: a 2 MB .npz can
// claim 2 GiB).
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

// glibc returns large freed blocks to the kernel (munmap, heap trimming) and page-faults them
// back on the next step: on the default job that is a third of CPU time. This keeps blocks up
// to 32 MiB in the heap and stops trimming, which made a CPU step 1.5× faster here
// (BENCHMARKS.md). Idempotent. Returns false when the C library has no mallopt (then nothing
// changed).
bool tune_host_allocator();

// Resident memory of this process (/proc/self/statm's resident pages × page size); 0 when unknown.
uint64_t resident_memory_bytes();

// T13 on the CPU: what tune_host_allocator keeps for the next step (freed blocks in glibc's
// arenas, the untrimmed heap top) goes back to the kernel (malloc_trim), as a GPU's caching
// allocator empties its cache. Returns the resident bytes that went (before − after, 0 when
// none, or without glibc).
int64_t release_freed_host_memory();

// Bytes of physical memory (sysconf _SC_PHYS_PAGES × _SC_PAGE_SIZE); 0 when unknown.
uint64_t physical_memory_bytes();

// Whether this CPU computes bf16 in hardware: x86 "avx512_bf16" or "amx_bf16", or Arm "bf16",
// among the flags of /proc/cpuinfo (`cpuinfo` is its text). Without them bf16 arithmetic is
// emulated through fp32 conversions and runs several times slower than fp32. `found` gets the
// flag that decided ("" when none).
bool cpuinfo_has_native_bf16(const std::string& cpuinfo, std::string* found = nullptr);
bool cpu_has_native_bf16(std::string* found = nullptr);  // this machine's /proc/cpuinfo

// MemAvailable from /proc/meminfo (what can be allocated without swapping), 0 when unknown.
uint64_t available_memory_bytes();

// The default memory budget of one read: half the physical memory (4 GiB when unknown).
uint64_t default_memory_budget();

// "812 bytes", "2084 KiB", "37.5 MiB", "2.0 GiB": a size for messages.
std::string human_bytes(uint64_t bytes);

// The bytes one read may inflate into memory (or through a stream) from compressed data:
// each member's declared size is taken before anything is allocated or inflated, and the
// running total of one read must stay within the limit. Not thread-safe: one per read.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes = 0);  // 0: default_memory_budget()

  // Takes `bytes` for `what` ("big.npz:x.npy"), inflated from `compressed_bytes`, or throws
  // bad_input naming `what`, both sizes, the budget and --memory-budget-mb.
  void take(uint64_t bytes, uint64_t compressed_bytes, const std::string& what);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_; }

 private:
  uint64_t limit_;
  uint64_t used_ = 0;
};

}  // namespace crucible
