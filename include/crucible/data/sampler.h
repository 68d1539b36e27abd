// The order in which an epoch visits a source. The order is a pure function of
// (seed, epoch) — there is no set_epoch() to forget (X1) — and for one process it equals
// PyTorch's DistributedSampler(num_replicas=1, seed=seed) after set_epoch(epoch):
// torch.randperm(n, generator seeded with seed + epoch). Thread-safe (immutable). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace crucible::data {

class Sampler {
 public:
  // `shuffle` false gives 0, 1, …, size-1 every epoch.
  Sampler(int64_t size, bool shuffle, uint64_t seed);

  int64_t size() const { return size_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }

  // Sample indices of epoch `epoch` (>= 0), in visiting order.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
};

}  // namespace crucible::data
