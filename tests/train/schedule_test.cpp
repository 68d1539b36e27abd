// T8: schedules as pure functions of the step. onecycle must equal PyTorch's OneCycleLR (lr
// and AdamW beta1) at every step — python3-torch is the oracle.
#include "crucible/train/schedule.h"

#include <gtest/gtest.h>

#include <map>

#include <sstream>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::train {
namespace {

TEST(Schedule, OneCycleEqualsPytorch) {
  const int total = 97;
  const std::string out = test::run_python(
      "import torch\n"
      "p = torch.nn.Parameter(torch.zeros(1))\n"
      "opt = torch.optim.AdamW([p], lr=0.002)\n"
      "s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.002, total_steps=" + std::to_string(total) + ", pct_start=0.3)\n"
      "for i in range(" + std::to_string(total) + "):\n"
      "    g = opt.param_groups[0]; print(repr(g['lr']), repr(g['betas'][0]))\n"
      "    opt.step(); s.step()\n");
  Schedule s(ScheduleOptions{}, 0.002, 0.9, total);
  std::istringstream in(out);
  for (int i = 0; i < total; ++i) {
    double lr = 0, beta1 = 0;
    ASSERT_TRUE(in >> lr >> beta1) << "step " << i;
    auto p = s.at(i);
    EXPECT_NEAR(p.lr, lr, 1e-15 + 1e-12 * lr) << "step " << i;
    EXPECT_NEAR(p.momentum, beta1, 1e-12) << "step " << i;
  }
}

TEST(Schedule, WarmupCosineRisesThenFalls) {
  ScheduleOptions o;
  o.name = "warmup_cosine";
  o.warmup = 0.1;
  Schedule s(o, 1.0, 0.9, 100);
  EXPECT_NEAR(s.at(0).lr, 1.0 / 25, 1e-12);
  EXPECT_NEAR(s.at(10).lr, 1.0, 1e-12);
  for (int i = 1; i < 10; ++i) EXPECT_GT(s.at(i).lr, s.at(i - 1).lr);
  for (int i = 11; i < 100; ++i) EXPECT_LT(s.at(i).lr, s.at(i - 1).lr);
  EXPECT_NEAR(s.at(99).lr, 1.0 / 25 / 1e4, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(50).momentum, 0.9);
}

TEST(Schedule, RejectsNoRisingPhase) {
  ScheduleOptions o;
  o.warmup = 0.01;
  EXPECT_THROW(Schedule(o, 1.0, 0.9, 50), Error);
  EXPECT_THROW(Schedule(ScheduleOptions{}, 1.0, 0.9, 0), Error);
}

}  // namespace
}  // namespace crucible::train

namespace crucible::train {
namespace {

// M4: a step's size is a function of (seed, step) alone — what every rank computes for itself,
// and what a resumed run computes again — and uses every size about equally.
TEST(MultiScale, SizeIsAFunctionOfSeedAndStepM4) {
  const std::vector<int64_t> sizes = {24, 28, 32};
  std::map<int64_t, int> count;
  int differs = 0;
  for (int64_t step = 0; step < 3000; ++step) {
    const int64_t s = multi_scale_size(7, step, sizes);
    EXPECT_EQ(s, multi_scale_size(7, step, sizes));  // another rank, or after a resume
    ++count[s];
    differs += s != multi_scale_size(8, step, sizes);
  }
  ASSERT_EQ(count.size(), 3u);
  for (const auto& [size, n] : count) EXPECT_NEAR(n, 1000, 120) << size;
  EXPECT_GT(differs, 1500);  // another seed, another sequence
  EXPECT_EQ(multi_scale_size(7, 5, {40}), 40);
}

}  // namespace
}  // namespace crucible::train
