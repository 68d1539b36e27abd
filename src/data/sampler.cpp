// Sampler: PyTorch's CPU randperm, reproduced without libtorch — torch.Generator is an MT19937
// seeded with the low 32 bits of its seed, and randperm is a Fisher-Yates pass swapping r[i]
// with r[i + random() % (n - i)] (aten/src/ATen/native/TensorFactories.cpp). The suite checks
// the result against python3-torch's DistributedSampler.
#include "crucible/data/sampler.h"

#include <numeric>
#include <random>
#include <utility>

namespace crucible::data {

Sampler::Sampler(int64_t size, bool shuffle, uint64_t seed) : size_(size), shuffle_(shuffle), seed_(seed) {}

std::vector<int64_t> Sampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle_) return order;
  std::mt19937 gen(static_cast<uint32_t>(seed_ + static_cast<uint64_t>(epoch)));
  for (int64_t i = 0; i + 1 < size_; ++i) {
    const int64_t z = static_cast<int64_t>(gen() % static_cast<uint64_t>(size_ - i));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(z + i)]);
  }
  return order;
}

}  // namespace crucible::data
