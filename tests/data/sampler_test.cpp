// X1: the order of an epoch is a function of (seed, epoch) and equals what PyTorch's
// DistributedSampler(num_replicas, rank, shuffle, seed, drop_last) yields after set_epoch.
#include "crucible/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
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

}  // namespace
}  // namespace crucible::data
