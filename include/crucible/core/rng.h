// Counter-based random numbers (Philox4x32-10 from Random123): a draw depends only on
// (seed, stream, counters), never on which thread asks or in what order (law 1). One run
// seed derives every stream (T15); a sample's augmentation stream is keyed by
// (seed, epoch, sample index), so batches are identical for any thread count and a resumed
// run continues bit-for-bit.
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

// The named random streams of a run. Values are part of the checkpoint contract: never renumber.
enum class RngStream : uint32_t {
  kInit = 1,     // model weight initialisation
  kSampler = 2,  // shuffling order per epoch
  kAugment = 3,  // per-sample augmentation
  kDropout = 4,  // dropout and other in-model randomness (torch's CPU generator)
  kScale = 5,    // multi-scale training: the input size of each step (M4)
  kMix = 6,      // MixUp/CutMix: the choice, λ and the box of each (step, rank)
  kErase = 7,    // random erasing: each sample's rectangle, keyed (epoch, sample index)
};

const char* rng_stream_name(RngStream stream);

// A 63-bit seed for `stream`, derived from the run seed (fits torch's manual_seed).
uint64_t derive_seed(uint64_t run_seed, RngStream stream);

// The stream of one sample in one epoch. Cheap to construct; not thread-safe (one per task).
// The epoch's low 32 bits and the index (below 2^32 samples) key the stream; the epoch's high 32
// bits carry a copy number (repeated augmentation: data::draw_epoch), 0 for the first copy, so
// every copy of a sample draws its own augmentation and a first copy draws what it always did.
class SampleRng {
 public:
  SampleRng(uint64_t stream_seed, uint64_t epoch, uint64_t index);

  uint32_t next_u32();
  // Uniform in [0, 1), 24-bit resolution (the same values on every platform).
  float uniform();
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  bool bernoulli(float p) { return uniform() < p; }

 private:
  uint32_t key_[2];
  uint32_t counter_[4];
  uint32_t block_[4];
  int used_ = 4;  // words of block_ already handed out
};

}  // namespace crucible
