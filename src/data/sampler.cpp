// Sampler: torch.randperm with a CPU generator seeded (seed + epoch), as DistributedSampler.
#include "crucible/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>

#include <numeric>

namespace crucible::data {

Sampler::Sampler(int64_t size, bool shuffle, uint64_t seed) : size_(size), shuffle_(shuffle), seed_(seed) {}

std::vector<int64_t> Sampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  if (!shuffle_) {
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
  at::Tensor perm = at::randperm(size_, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* p = perm.data_ptr<int64_t>();
  std::copy(p, p + size_, order.begin());
  return order;
}

}  // namespace crucible::data
