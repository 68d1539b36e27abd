// RepeatedAugmentationSampler: the permutation is DistributedSampler's with one replica (torch's
// randperm for seed + epoch, or 0…n-1), then RASampler's repetition, padding, striding and
// truncation. The suite checks the result against RASampler's own code run by python3-torch.
#include "crucible/data/samplers/repeated_sampler.h"

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"

namespace crucible::data {

void declare_settings(ConfigSchema& s, RepeatedSamplerOptions& o) {
  s.add("data", "repeats", &o.repeats,
        "data.sampler = \"repeated\": copies of each sample (RASampler's repetitions, train.py's --ra-reps)")
      .min(1);
}

RepeatedAugmentationSampler::RepeatedAugmentationSampler(int64_t size, bool shuffle, uint64_t seed, int64_t repeats,
                                                         Shard shard)
    : size_(size), shuffle_(shuffle), seed_(seed), repeats_(repeats), shard_(shard) {
  if (size_ < 0) throw bad_input("sampler: data set size must be >= 0, found {}", size_);
  if (repeats_ < 1) {
    throw bad_input("data.sampler = \"repeated\": data.repeats (copies of each sample) must be >= 1, found {}",
                    repeats_);
  }
  if (shard_.num_replicas < 1) throw bad_input("sampler: num_replicas must be >= 1, found {}", shard_.num_replicas);
  if (shard_.rank < 0 || shard_.rank >= shard_.num_replicas) {
    throw bad_input("sampler: rank must be in [0, {}) for num_replicas {}, found {}", shard_.num_replicas,
                    shard_.num_replicas, shard_.rank);
  }
  // RASampler: int(math.floor(len(dataset) // 256 * 256 / num_replicas)) — whole multiples of
  // 256 samples per epoch, over all ranks.
  const int64_t r = shard_.num_replicas;
  num_selected_ = size_ / 256 * 256 / r;
  if (num_selected_ == 0) {
    throw bad_input("data.sampler = \"repeated\" (torchvision's RASampler) gives each rank floor({} // 256 * 256 / {}) "
                    "= 0 samples an epoch for a data set of {} samples over {} rank(s): it visits whole multiples of "
                    "256 samples, so it needs at least {} training samples here; use more samples or data.sampler = "
                    "\"distributed\"",
                    size_, r, size_, r, 256 * ((r + 255) / 256));
  }
}

std::vector<int64_t> RepeatedAugmentationSampler::epoch_order(int64_t epoch) const {
  const std::vector<int64_t> perm = DistributedSampler(size_, shuffle_, seed_).epoch_order(epoch);
  // Position q of the repeated list is perm[q / repeats]; the padding (fewer than num_replicas
  // positions, and num_replicas <= size here) repeats the list's start, so position p of the
  // padded list is position p % (size * repeats). This rank takes positions rank, rank + R, …
  // and keeps the first num_selected (which never reach the padding: num_selected * R <= size).
  const int64_t length = size_ * repeats_;
  std::vector<int64_t> mine(static_cast<size_t>(num_selected_));
  for (int64_t k = 0; k < num_selected_; ++k) {
    const int64_t p = (shard_.rank + k * shard_.num_replicas) % length;
    mine[static_cast<size_t>(k)] = perm[static_cast<size_t>(p / repeats_)];
  }
  return mine;
}

std::vector<int64_t> RepeatedAugmentationSampler::epoch_copies(int64_t /*epoch*/) const {
  std::vector<int64_t> copies(static_cast<size_t>(num_selected_));
  for (int64_t k = 0; k < num_selected_; ++k) {
    copies[static_cast<size_t>(k)] = ((shard_.rank + k * shard_.num_replicas) % (size_ * repeats_)) % repeats_;
  }
  return copies;
}

std::string RepeatedAugmentationSampler::describe() const {
  return fmt::format("RASampler ({}, {} repeats{}): {} samples an epoch", shuffle_ ? "shuffled" : "in order", repeats_,
                     shard_.num_replicas > 1 ? fmt::format(", rank {} of {}", shard_.rank, shard_.num_replicas) : "",
                     num_selected_);
}

}  // namespace crucible::data
