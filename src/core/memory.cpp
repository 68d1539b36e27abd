// tune_host_allocator: glibc mallopt (no other allocator needed; tcmalloc measured the same).
#include "crucible/core/memory.h"

#include <cstddef>  // defines __GLIBC__ on glibc systems

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

}  // namespace crucible
