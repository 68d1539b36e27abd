// One global order, any world size (data.sampler = "global"; the default for remote data,
// issue 37). Elastic determinism, as Mosaic's streaming calls it: the order of an epoch is one
// permutation of the data set that does not depend on the number of ranks, and global step s
// trains on its samples [s·G, (s+1)·G) (G = the global batch), rank r taking the contiguous
// slice [s·G + r·b, s·G + (r+1)·b) (b = G / ranks). A checkpoint's position (epoch, step) thus
// names the same samples at any world size that divides G: a run resumed on fewer or more ranks
// trains each step on the same set of samples, and sees every sample of the epoch once.
//
// The permutation, per (seed, epoch): with the shuffle window covering every shard (window 0,
// or an unsharded source) it is torch.randperm(n) seeded with seed + epoch — the order
// DistributedSampler gives one replica. Otherwise the shards are shuffled, then taken `window`
// at a time and the samples of each group shuffled together (WebDataset's and Mosaic's
// shard-then-buffer shuffle): a reader needs only the shards of one window at a time, which is
// what lets remote shards stream through a bounded cache. The same MT19937 stream draws both.
// The tail: padded from the permutation's start to a multiple of G (drop_last: truncated).
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/samplers/sampler.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

// data.sampler = "global"'s setting.
struct GlobalOrderOptions {
  int64_t shuffle_window = 16;  // data.shuffle_window: shards shuffled together; 0: all (a full shuffle)
};
void declare_settings(ConfigSchema& schema, GlobalOrderOptions& options);

class GlobalOrderSampler final : public Sampler {
 public:
  // `shard_counts`: samples per shard (SampleSource::shard_counts), empty for an unsharded
  // source; `batch` the per-rank batch b. bad_input for a bad shard, window or batch.
  GlobalOrderSampler(int64_t size, std::vector<int64_t> shard_counts, int64_t window, bool shuffle, uint64_t seed,
                     int64_t batch, Shard shard);

  int64_t size() const override { return size_; }
  int64_t num_samples() const override { return steps_ * batch_; }
  std::vector<int64_t> epoch_order(int64_t epoch) const override;
  std::string describe() const override;

  // The epoch's permutation of every index, before padding and the split across ranks.
  std::vector<int64_t> global_order(int64_t epoch) const;
  int64_t global_batch() const { return batch_ * shard_.num_replicas; }
  int64_t steps_per_epoch() const { return steps_; }

 private:
  int64_t size_;
  std::vector<int64_t> counts_;  // samples per shard (one entry for an unsharded source)
  int64_t window_;               // shards per window (counts_.size() for a full shuffle)
  bool shuffle_;
  uint64_t seed_;
  int64_t batch_;
  Shard shard_;
  int64_t steps_;
};

}  // namespace crucible::data
