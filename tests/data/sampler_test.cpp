// X1: the order of an epoch is a function of (seed, epoch) and equals what PyTorch's
// DistributedSampler(num_replicas, rank, shuffle, seed, drop_last) yields after set_epoch —
// and, for data.sampler = "repeated", what torchvision's RASampler yields.
#include "crucible/data/samplers/sampler.h"
#include "crucible/data/samplers/repeated_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "test_util.h"

namespace crucible::data {
namespace {

TEST(Sampler, OrderEqualsPytorchDistributedSampler) {
  const std::string out = test::run_python(
      "import torch\n"
      "from torch.utils.data import DistributedSampler\n"
      "for n, seed, epoch in [(10, 0, 0), (1000, 7, 3), (60000, 123, 9)]:\n"
      "    s = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=seed)\n"
      "    s.set_epoch(epoch)\n"
      "    print(n, seed, epoch, *list(s))\n");
  std::istringstream in(out);
  int cases = 0;
  int64_t n, seed, epoch;
  while (in >> n >> seed >> epoch) {
    std::vector<int64_t> expect(static_cast<size_t>(n));
    for (auto& v : expect) in >> v;
    EXPECT_EQ(DistributedSampler(n, true, static_cast<uint64_t>(seed)).epoch_order(epoch), expect) << n << " " << seed << " " << epoch;
    ++cases;
  }
  EXPECT_EQ(cases, 3);
}

TEST(Sampler, EpochsDifferAndArePermutations) {
  DistributedSampler s(500, true, 1);
  auto a = s.epoch_order(0), b = s.epoch_order(1);
  EXPECT_NE(a, b);  // X1: no set_epoch to forget
  EXPECT_EQ(a, s.epoch_order(0));
  std::sort(a.begin(), a.end());
  std::vector<int64_t> iota(500);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(a, iota);
  EXPECT_EQ(DistributedSampler(5, false, 1).epoch_order(3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// X1: every rank's share, padded or truncated, equals DistributedSampler's over a grid that
// includes empty data sets, fewer samples than replicas and padding longer than the data set.
TEST(Sampler, ShardsEqualPytorchDistributedSamplerGridX1) {
  const std::string out = test::run_python(
      "from torch.utils.data import DistributedSampler\n"
      "for n in [0, 1, 2, 5, 10, 17, 100]:\n"
      "  for world in [1, 2, 3, 4, 7]:\n"
      "    for rank in range(world):\n"
      "      for shuffle in [0, 1]:\n"
      "        for drop in [0, 1]:\n"
      "          for seed in [0, 42]:\n"
      "            for epoch in [0, 3]:\n"
      "              s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=bool(shuffle),\n"
      "                                     seed=seed, drop_last=bool(drop))\n"
      "              s.set_epoch(epoch)\n"
      "              idx = list(s)\n"
      "              print(n, world, rank, shuffle, drop, seed, epoch, len(s), len(idx), *idx)\n");
  std::istringstream in(out);
  int cases = 0;
  int64_t n, world, rank, shuffle, drop, seed, epoch, len, count;
  while (in >> n >> world >> rank >> shuffle >> drop >> seed >> epoch >> len >> count) {
    std::vector<int64_t> expect(static_cast<size_t>(count));
    for (auto& v : expect) in >> v;
    const DistributedSampler s(n, shuffle != 0, static_cast<uint64_t>(seed), Sampler::Shard{world, rank, drop != 0});
    const std::string what = "n=" + std::to_string(n) + " world=" + std::to_string(world) + " rank=" +
                             std::to_string(rank) + " shuffle=" + std::to_string(shuffle) + " drop_last=" +
                             std::to_string(drop) + " seed=" + std::to_string(seed) + " epoch=" + std::to_string(epoch);
    EXPECT_EQ(s.size(), n) << what;
    EXPECT_EQ(s.num_samples(), len) << what;
    EXPECT_EQ(s.epoch_order(epoch), expect) << what;
    ++cases;
  }
  EXPECT_EQ(cases, 7 * (1 + 2 + 3 + 4 + 7) * 2 * 2 * 2 * 2);
}

TEST(Sampler, ShardOptionsAreValidatedX1) {
  test::expect_bad_input([] { DistributedSampler(10, true, 0, Sampler::Shard{0, 0, false}); }, {"num_replicas", "0"});
  test::expect_bad_input([] { DistributedSampler(10, true, 0, Sampler::Shard{4, 4, false}); }, {"rank", "[0, 4)", "found 4"});
  test::expect_bad_input([] { DistributedSampler(10, true, 0, Sampler::Shard{4, -1, false}); }, {"rank", "found -1"});
  const DistributedSampler s(10, true, 0, Sampler::Shard{3, 2, true});
  EXPECT_EQ(s.shard().num_replicas, 3);
  EXPECT_EQ(s.shard().rank, 2);
  EXPECT_TRUE(s.shard().drop_last);
  EXPECT_EQ(s.num_samples(), 3);
  EXPECT_EQ(DistributedSampler(10, true, 0).num_samples(), 10);
}

// X1: RepeatedAugmentationSampler's share of every rank equals torchvision's RASampler
// (references/classification/sampler.py, its class body pasted below; it needs only torch)
// after set_epoch(epoch), for every (size, world, rank, epoch, seed, repeats) of the grid —
// shuffled, as training uses it, with a seed past 32 bits as derive_seed gives, plus an
// unshuffled sub-grid and 512 samples over 256 ranks (one sample each). One python run.
TEST(Sampler, RepeatedEqualsTorchvisionRASamplerGridX1) {
  const std::string out = test::run_python(R"py(
import math
import torch
import torch.distributed as dist


class RASampler(torch.utils.data.Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, repetitions=3):
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.num_samples = int(math.ceil(len(self.dataset) * float(repetitions) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.num_selected_samples = int(math.floor(len(self.dataset) // 256 * 256 / self.num_replicas))
        self.shuffle = shuffle
        self.seed = seed
        self.repetitions = repetitions

    def __iter__(self):
        if self.shuffle:
            # Deterministically shuffle based on epoch
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            indices = list(range(len(self.dataset)))

        # Add extra samples to make it evenly divisible
        indices = [ele for ele in indices for i in range(self.repetitions)]
        indices += indices[: (self.total_size - len(indices))]
        assert len(indices) == self.total_size

        # Subsample
        indices = indices[self.rank : self.total_size : self.num_replicas]
        assert len(indices) == self.num_samples

        return iter(indices[: self.num_selected_samples])

    def __len__(self):
        return self.num_selected_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


cases = [(n, world, rank, 1, epoch, seed, reps)
         for n in [256, 300, 1000, 1337] for world in [1, 2, 3, 4, 8] for rank in range(world)
         for epoch in [0, 1, 5] for seed in [0, 7, 2**62 + 3] for reps in [1, 2, 3, 4]]
cases += [(n, world, rank, 0, 2, 0, reps)
          for n in [256, 300, 1000, 1337] for world in [1, 2, 3, 4, 8] for rank in range(world) for reps in [1, 2, 3, 4]]
cases += [(512, 256, rank, 1, 2, 7, 3) for rank in range(256)]
lines = []
for n, world, rank, shuffle, epoch, seed, reps in cases:
    s = RASampler(range(n), num_replicas=world, rank=rank, shuffle=bool(shuffle), seed=seed, repetitions=reps)
    s.set_epoch(epoch)
    idx = list(s)
    lines.append(' '.join(map(str, [n, world, rank, shuffle, epoch, seed, reps, len(s), len(idx)] + idx)))
print('\n'.join(lines))
)py");
  std::istringstream in(out);
  int cases = 0, failures = 0;
  int64_t n, world, rank, shuffle, epoch, reps, len, count;
  uint64_t seed;
  while (in >> n >> world >> rank >> shuffle >> epoch >> seed >> reps >> len >> count) {
    std::vector<int64_t> expect(static_cast<size_t>(count));
    for (auto& v : expect) in >> v;
    const RepeatedAugmentationSampler s(n, shuffle != 0, seed, reps, Sampler::Shard{world, rank, false});
    const std::string what = "n=" + std::to_string(n) + " world=" + std::to_string(world) + " rank=" +
                             std::to_string(rank) + " shuffle=" + std::to_string(shuffle) + " epoch=" +
                             std::to_string(epoch) + " seed=" + std::to_string(seed) + " repeats=" + std::to_string(reps);
    const bool ok = s.size() == n && s.num_samples() == len && count == len && s.epoch_order(epoch) == expect;
    if (!ok && ++failures <= 5) {  // a broken sampler fails every case: name a few, not thousands
      EXPECT_EQ(s.num_samples(), len) << what;
      EXPECT_EQ(s.epoch_order(epoch), expect) << what;
    }
    ++cases;
  }
  EXPECT_EQ(failures, 0);
  constexpr int kRanks = 1 + 2 + 3 + 4 + 8;
  EXPECT_EQ(cases, 4 * kRanks * 3 * 3 * 4 + 4 * kRanks * 4 + 256);
}

// Within one epoch the copies of a sample are neighbours in the repeated order: with one rank,
// runs of `repeats` equal indices (the last run cut by the truncation), distinct across runs.
TEST(Sampler, RepeatedVisitsEachSampleRepeatsTimesInARow) {
  const RepeatedAugmentationSampler s(1000, true, 5, 3, Sampler::Shard{});
  EXPECT_EQ(s.num_samples(), 768);
  const std::vector<int64_t> order = s.epoch_order(4);
  ASSERT_EQ(order.size(), 768u);
  std::vector<int64_t> firsts;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k % 3 == 0) firsts.push_back(order[k]);
    EXPECT_EQ(order[k], order[k - k % 3]) << k;
  }
  std::sort(firsts.begin(), firsts.end());
  EXPECT_EQ(std::adjacent_find(firsts.begin(), firsts.end()), firsts.end());  // 256 distinct samples
  EXPECT_NE(order, s.epoch_order(5));  // X1: a new order every epoch, no set_epoch
  EXPECT_EQ(order, s.epoch_order(4));
  EXPECT_EQ(s.describe(), "RASampler (shuffled, 3 repeats): 768 samples an epoch");
}

// epoch_copies numbers the copies: over all ranks an epoch visits each (sample, copy) at most
// once, copies 0 … repeats-1 of a sample (the padding aside); one rank sees 0, 1, 2, 0, 1, 2, ….
TEST(Sampler, RepeatedCopiesAreNumberedAcrossRanks) {
  for (int64_t world : {1, 2, 3, 8}) {
    std::set<std::pair<int64_t, int64_t>> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      const RepeatedAugmentationSampler s(1000, true, 5, 4, Sampler::Shard{world, rank, false});
      const std::vector<int64_t> order = s.epoch_order(1), copies = s.epoch_copies(1);
      ASSERT_EQ(copies.size(), order.size());
      for (size_t k = 0; k < order.size(); ++k) {
        ASSERT_GE(copies[k], 0);
        ASSERT_LT(copies[k], 4);
        EXPECT_TRUE(seen.insert({order[k], copies[k]}).second) << "world " << world << " rank " << rank << " k " << k;
        if (world == 1) {
          EXPECT_EQ(copies[k], static_cast<int64_t>(k % 4));
        }
      }
    }
  }
  EXPECT_TRUE(DistributedSampler(10, true, 0).epoch_copies(0).empty());  // every position a first copy
  EXPECT_EQ(draw_epoch(7, 0), 7);
  EXPECT_NE(draw_epoch(7, 1), draw_epoch(8, 0));
}

// RASampler would silently yield nothing below 256 samples (or with more ranks than whole
// 256-sample blocks): refused, naming the key, the size and the reason.
TEST(Sampler, RepeatedRefusesAnEmptyEpochAndBadRepeats) {
  test::expect_bad_input([] { RepeatedAugmentationSampler(255, true, 0, 3, Sampler::Shard{}); },
                         {"data.sampler = \"repeated\"", "255 samples", "= 0 samples", "multiples of 256",
                          "at least 256"});
  test::expect_bad_input([] { RepeatedAugmentationSampler(0, true, 0, 3, Sampler::Shard{}); }, {"0 samples"});
  test::expect_bad_input([] { RepeatedAugmentationSampler(600, true, 0, 3, Sampler::Shard{513, 0, false}); },
                         {"data.sampler", "600 samples over 513 rank(s)", "at least 768"});
  test::expect_bad_input([] { RepeatedAugmentationSampler(1000, true, 0, 0, Sampler::Shard{}); },
                         {"data.repeats", ">= 1", "found 0"});
  test::expect_bad_input([] { RepeatedAugmentationSampler(1000, true, 0, -2, Sampler::Shard{}); },
                         {"data.repeats", "found -2"});
  test::expect_bad_input([] { RepeatedAugmentationSampler(1000, true, 0, 3, Sampler::Shard{4, 4, false}); },
                         {"rank", "[0, 4)", "found 4"});
  EXPECT_EQ(RepeatedAugmentationSampler(256, true, 0, 3, Sampler::Shard{}).num_samples(), 256);
  EXPECT_EQ(RepeatedAugmentationSampler(512, true, 0, 3, Sampler::Shard{512, 511, false}).num_samples(), 1);
}

}  // namespace
}  // namespace crucible::data
