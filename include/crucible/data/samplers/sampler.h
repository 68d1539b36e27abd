// The order in which an epoch visits a source: a Sampler gives this rank's sample indices of
// each epoch as a pure function of (seed, epoch) — there is no set_epoch() to forget (X1). The
// Loader takes any Sampler; a job's is chosen by data.sampler from the registry in
// train/recipe.cpp. Implementations are immutable once built (thread-safe). Torch-free.
//
// DistributedSampler equals PyTorch's DistributedSampler(num_replicas, rank, shuffle, seed,
// drop_last) after set_epoch(epoch): torch.randperm(n, generator seeded with seed + epoch) (or
// 0…n-1), padded by repeating its start (or truncated, with drop_last) to a multiple of
// num_replicas, then every num_replicas-th index from `rank`.
#pragma once

#include <cstdint>
#include <string>
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

  virtual ~Sampler() = default;
  virtual int64_t size() const = 0;  // the data set's size, not this rank's share
  // Indices this rank visits per epoch (the length of epoch_order).
  virtual int64_t num_samples() const = 0;
  // This rank's sample indices of epoch `epoch` (>= 0), in visiting order.
  virtual std::vector<int64_t> epoch_order(int64_t epoch) const = 0;
  // One phrase for the log ("DistributedSampler, shuffled, 2 replicas").
  virtual std::string describe() const = 0;
  // For a sampler that visits a sample more than once an epoch (repeated augmentation): which
  // copy each position of epoch_order is (0, 1, …), so that each copy draws its own augmentation
  // (draw_epoch). Empty: every position is a first copy.
  virtual std::vector<int64_t> epoch_copies(int64_t epoch) const { return {}; }
};

// The epoch a sample's random streams are keyed on (SampleRng): the epoch, with the copy number
// in the high 32 bits — the epoch itself for a first copy.
constexpr int64_t draw_epoch(int64_t epoch, int64_t copy) { return epoch + copy * (int64_t{1} << 32); }

class DistributedSampler final : public Sampler {
 public:
  // `shuffle` false gives 0, 1, …, size-1 every epoch. One replica.
  DistributedSampler(int64_t size, bool shuffle, uint64_t seed);
  // Throws bad_input unless num_replicas >= 1 and 0 <= rank < num_replicas.
  DistributedSampler(int64_t size, bool shuffle, uint64_t seed, Shard shard);

  int64_t size() const override { return size_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  const Shard& shard() const { return shard_; }
  int64_t num_samples() const override { return num_samples_; }
  std::vector<int64_t> epoch_order(int64_t epoch) const override;
  std::string describe() const override;

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
  Shard shard_;
  int64_t num_samples_;
};

}  // namespace crucible::data
