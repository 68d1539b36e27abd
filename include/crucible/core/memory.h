// Host allocator settings for training. glibc returns large freed blocks to the kernel
// (munmap, heap trimming) and page-faults them back on the next step: on the default job
// that is a third of CPU time. tune_host_allocator() keeps blocks up to 32 MiB in the heap
// and stops trimming, which made a CPU step 1.5× faster here (BENCHMARKS.md). Idempotent.
#pragma once

namespace crucible {

// Returns false when the C library has no mallopt (then nothing changed).
bool tune_host_allocator();

}  // namespace crucible
