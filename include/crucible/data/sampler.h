// The order in which an epoch visits a source. The order is a pure function of
// (seed, epoch) — there is no set_epoch() to forget (X1) — and equals PyTorch's
// DistributedSampler(num_replicas, rank, shuffle, seed, drop_last) after set_epoch(epoch):
// torch.randperm(n, generator seeded with seed + epoch) (or 0…n-1), padded by repeating its
// start (or truncated, with drop_last) to a multiple of num_replicas, then every
// num_replicas-th index from `rank`. Thread-safe (immutable). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace crucible::data {

class Sampler {
 public:
  // This process's part of the data set: DistributedSampler's num_replicas, rank, drop_last.
  struct Shard {
    int64_t num_replicas = 1;
    int64_t rank = 0;
    bool drop_last = false;  // drop the tail that does not divide evenly instead of padding
  };

  // `shuffle` false gives 0, 1, …, size-1 every epoch. One replica.
  Sampler(int64_t size, bool shuffle, uint64_t seed);
  // Throws bad_input unless num_replicas >= 1 and 0 <= rank < num_replicas.
  Sampler(int64_t size, bool shuffle, uint64_t seed, Shard shard);

  int64_t size() const { return size_; }  // the data set's size, not this rank's share
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  const Shard& shard() const { return shard_; }
  // Indices this rank visits per epoch (the length of epoch_order).
  int64_t num_samples() const { return num_samples_; }

  // This rank's sample indices of epoch `epoch` (>= 0), in visiting order.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
  Shard shard_;
  int64_t num_samples_;
};

}  // namespace crucible::data
