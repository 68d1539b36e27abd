// Repeated augmentation (DeiT; data.sampler = "repeated"): RepeatedAugmentationSampler equals
// torchvision's RASampler(dataset, num_replicas, rank, shuffle, seed, repetitions)
// (references/classification/sampler.py) at epoch `epoch`: torch.randperm(n, generator seeded
// with seed + epoch) (or 0…n-1), each index repeated `repeats` times in a row, padded from its
// start to a multiple of num_replicas, every num_replicas-th position from `rank`, truncated to
// floor(n // 256 * 256 / num_replicas) — so an epoch visits about n / repeats distinct samples,
// each `repeats` times, and the copies of one sample usually land on neighbouring ranks (X1: a
// pure function of (seed, epoch), no set_epoch).
//
// Each copy draws its own augmentation: epoch_copies numbers them (position p of the repeated list
// is copy p % repeats), and the loader keys a copy's stream on draw_epoch(epoch, copy) — as each
// of RASampler's copies gets its own draw from its process's random state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/samplers/sampler.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

// data.sampler = "repeated"'s setting: data.repeats, RASampler's repetitions (train.py's --ra-reps).
struct RepeatedSamplerOptions {
  int64_t repeats = 3;
};
void declare_settings(ConfigSchema& schema, RepeatedSamplerOptions& options);

class RepeatedAugmentationSampler final : public Sampler {
 public:
  // `shard.drop_last` is not used (RASampler has none). Throws bad_input unless repeats >= 1,
  // num_replicas >= 1, 0 <= rank < num_replicas, and each rank gets at least one sample an
  // epoch (size // 256 * 256 >= num_replicas: a data set of fewer than 256 samples gets none).
  RepeatedAugmentationSampler(int64_t size, bool shuffle, uint64_t seed, int64_t repeats, Shard shard);

  int64_t size() const override { return size_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  int64_t repeats() const { return repeats_; }
  const Shard& shard() const { return shard_; }
  // RASampler's len(): floor(size // 256 * 256 / num_replicas).
  int64_t num_samples() const override { return num_selected_; }
  std::vector<int64_t> epoch_order(int64_t epoch) const override;
  std::vector<int64_t> epoch_copies(int64_t epoch) const override;
  std::string describe() const override;

 private:
  int64_t size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t repeats_;
  Shard shard_;
  int64_t num_selected_;
};

}  // namespace crucible::data
