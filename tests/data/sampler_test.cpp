// X1: the order of an epoch is a function of (seed, epoch) and equals what PyTorch's
// DistributedSampler(num_replicas=1, rank=0, shuffle=True, seed) yields after set_epoch.
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
    EXPECT_EQ(Sampler(n, true, static_cast<uint64_t>(seed)).epoch_order(epoch), expect) << n << " " << seed << " " << epoch;
    ++cases;
  }
  EXPECT_EQ(cases, 3);
}

TEST(Sampler, EpochsDifferAndArePermutations) {
  Sampler s(500, true, 1);
  auto a = s.epoch_order(0), b = s.epoch_order(1);
  EXPECT_NE(a, b);  // X1: no set_epoch to forget
  EXPECT_EQ(a, s.epoch_order(0));
  std::sort(a.begin(), a.end());
  std::vector<int64_t> iota(500);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(a, iota);
  EXPECT_EQ(Sampler(5, false, 1).epoch_order(3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace crucible::data
