// GlobalOrderSampler (global_sampler.h): the shard-window permutation, then the contiguous
// split of each global step across ranks. The suite checks: the same per-step sample sets at 1,
// 2 and 3 ranks, torch.randperm's order for a full shuffle, and every sample once per epoch.
#include "crucible/data/samplers/global_sampler.h"

#include <fmt/format.h>

#include <numeric>
#include <random>
#include <utility>

#include "crucible/core/config.h"
#include "crucible/core/error.h"

namespace crucible::data {
namespace {

// torch.randperm's Fisher-Yates (sampler.cpp says why): r[i] swaps with r[i + gen() % (n - i)].
template <typename T>
void shuffle_like_randperm(std::vector<T>& v, std::mt19937& gen) {
  const auto n = static_cast<int64_t>(v.size());
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(gen() % static_cast<uint64_t>(n - i));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(z + i)]);
  }
}

}  // namespace

void declare_settings(ConfigSchema& s, GlobalOrderOptions& o) {
  s.add("data", "shuffle_window", &o.shuffle_window,
        "data.sampler = \"global\": shards whose samples are shuffled together (shards are shuffled first); 0 = all "
        "of them, a full shuffle. Remote data streams one window at a time through data.cache_bytes")
      .min(0);
}

GlobalOrderSampler::GlobalOrderSampler(int64_t size, std::vector<int64_t> shard_counts, int64_t window, bool shuffle,
                                       uint64_t seed, int64_t batch, Shard shard)
    : size_(size), counts_(std::move(shard_counts)), shuffle_(shuffle), seed_(seed), batch_(batch), shard_(shard) {
  if (size_ < 0) throw bad_input("sampler: data set size must be >= 0, found {}", size_);
  if (shard_.num_replicas < 1) throw bad_input("sampler: num_replicas must be >= 1, found {}", shard_.num_replicas);
  if (shard_.rank < 0 || shard_.rank >= shard_.num_replicas) {
    throw bad_input("sampler: rank must be in [0, {}) for num_replicas {}, found {}", shard_.num_replicas,
                    shard_.num_replicas, shard_.rank);
  }
  if (batch_ < 1) throw bad_input("data.sampler = \"global\": the per-rank batch should be >= 1, found {}", batch_);
  if (window < 0) throw bad_input("data.shuffle_window should be >= 0, found {}", window);
  if (counts_.empty()) counts_ = {size_};
  int64_t total = 0;
  for (int64_t c : counts_) {
    if (c < 0) throw bad_input("sampler: a shard of {} samples", c);
    total += c;
  }
  if (total != size_) throw bad_input("sampler: the shards hold {} samples, the data set {}", total, size_);
  window_ = window == 0 ? static_cast<int64_t>(counts_.size()) : std::min<int64_t>(window, counts_.size());
  const int64_t g = global_batch();
  steps_ = shard_.drop_last ? size_ / g : (size_ + g - 1) / g;
}

std::vector<int64_t> GlobalOrderSampler::global_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle_) return order;
  std::mt19937 gen(static_cast<uint32_t>(seed_ + static_cast<uint64_t>(epoch)));
  const auto shards = static_cast<int64_t>(counts_.size());
  if (window_ >= shards) {  // one window: torch.randperm(n)
    shuffle_like_randperm(order, gen);
    return order;
  }
  std::vector<int64_t> first(counts_.size(), 0);  // each shard's first index
  for (size_t k = 1; k < counts_.size(); ++k) first[k] = first[k - 1] + counts_[k - 1];
  std::vector<int64_t> shard_order(counts_.size());
  std::iota(shard_order.begin(), shard_order.end(), 0);
  shuffle_like_randperm(shard_order, gen);
  order.clear();
  for (int64_t w = 0; w < shards; w += window_) {
    std::vector<int64_t> group;
    for (int64_t k = w; k < std::min(shards, w + window_); ++k) {
      const auto s = static_cast<size_t>(shard_order[static_cast<size_t>(k)]);
      for (int64_t i = 0; i < counts_[s]; ++i) group.push_back(first[s] + i);
    }
    shuffle_like_randperm(group, gen);
    order.insert(order.end(), group.begin(), group.end());
  }
  return order;
}

std::vector<int64_t> GlobalOrderSampler::epoch_order(int64_t epoch) const {
  const std::vector<int64_t> order = global_order(epoch);
  const int64_t g = global_batch();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples()));
  for (int64_t s = 0; s < steps_ && size_ > 0; ++s) {
    const int64_t begin = s * g + shard_.rank * batch_;
    for (int64_t k = 0; k < batch_; ++k) {  // past the end: the padding, from the start
      mine.push_back(order[static_cast<size_t>((begin + k) % size_)]);
    }
  }
  return mine;
}

std::string GlobalOrderSampler::describe() const {
  return fmt::format("global order ({}, {}; global batch {} = {} × {} rank{}{}), {} steps an epoch",
                     shuffle_ ? "shuffled" : "in order",
                     window_ >= static_cast<int64_t>(counts_.size())
                         ? std::string("one window")
                         : fmt::format("windows of {} of {} shards", window_, counts_.size()),
                     global_batch(), batch_, shard_.num_replicas, shard_.num_replicas == 1 ? "" : "s",
                     shard_.num_replicas > 1 ? fmt::format(", rank {}", shard_.rank) : "", steps_);
}

}  // namespace crucible::data
