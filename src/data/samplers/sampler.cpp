// DistributedSampler: PyTorch's CPU randperm, reproduced without libtorch — torch.Generator is an MT19937
// seeded with the low 32 bits of its seed, and randperm is a Fisher-Yates pass swapping r[i]
// with r[i + random() % (n - i)] (aten/src/ATen/native/TensorFactories.cpp) — then
// DistributedSampler's padding/truncation and striding (torch/utils/data/distributed.py).
// The suite checks the result against python3-torch's DistributedSampler.
#include "crucible/data/samplers/sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::data {

DistributedSampler::DistributedSampler(int64_t size, bool shuffle, uint64_t seed)
    : DistributedSampler(size, shuffle, seed, Shard{}) {}

DistributedSampler::DistributedSampler(int64_t size, bool shuffle, uint64_t seed, Shard shard)
    : size_(size), shuffle_(shuffle), seed_(seed), shard_(shard) {
  if (size_ < 0) throw bad_input("sampler: data set size must be >= 0, found {}", size_);
  if (shard_.num_replicas < 1) throw bad_input("sampler: num_replicas must be >= 1, found {}", shard_.num_replicas);
  if (shard_.rank < 0 || shard_.rank >= shard_.num_replicas) {
    throw bad_input("sampler: rank must be in [0, {}) for num_replicas {}, found {}", shard_.num_replicas,
                    shard_.num_replicas, shard_.rank);
  }
  // DistributedSampler: with drop_last and an uneven split, ceil((n - R) / R), which is
  // floor(n / R) for n % R != 0 (and 0 when n < R); otherwise ceil(n / R).
  const int64_t r = shard_.num_replicas;
  num_samples_ = shard_.drop_last ? size_ / r : (size_ + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) {
    std::mt19937 gen(static_cast<uint32_t>(seed_ + static_cast<uint64_t>(epoch)));
    for (int64_t i = 0; i + 1 < size_; ++i) {
      const int64_t z = static_cast<int64_t>(gen() % static_cast<uint64_t>(size_ - i));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(z + i)]);
    }
  }
  if (shard_.num_replicas == 1) return order;  // the whole list (num_samples == size)
  // Padding repeats the list from its start (as often as needed when it is shorter than the
  // padding) and truncation keeps a prefix, so position k of the padded/truncated list is
  // order[k % n]; this rank takes positions rank, rank + R, … of num_samples * R.
  std::vector<int64_t> mine(static_cast<size_t>(num_samples_));
  for (int64_t k = 0; k < num_samples_; ++k) {
    const int64_t pos = shard_.rank + k * shard_.num_replicas;
    mine[static_cast<size_t>(k)] = order[static_cast<size_t>(pos % size_)];
  }
  return mine;
}

std::string DistributedSampler::describe() const {
  return fmt::format("DistributedSampler ({}{})", shuffle_ ? "shuffled" : "in order",
                     shard_.num_replicas > 1 ? fmt::format(", rank {} of {}", shard_.rank, shard_.num_replicas) : "");
}

}  // namespace crucible::data
