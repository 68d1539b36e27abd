// The bottleneck verdict (T12, X6): each group of phases wins when it dominates the step, the
// threshold holds, and the fix names the setting that would help for what the run knows.
#include "crucible/obs/breakdown.h"

#include <gtest/gtest.h>

namespace crucible::obs {
namespace {

PhaseSeconds phases(double wait, double transfer, double fwd, double bwd, double comm, double opt, double host,
                    double other = 0) {
  PhaseSeconds p;
  p[Phase::kDataWait] = wait;
  p[Phase::kTransfer] = transfer;
  p[Phase::kForward] = fwd;
  p[Phase::kBackward] = bwd;
  p[Phase::kCommunication] = comm;
  p[Phase::kOptimizer] = opt;
  p[Phase::kHostSync] = host;
  p[Phase::kOther] = other;
  return p;
}

TEST(Breakdown, PhaseNamesAreTheMetricsKeys) {
  EXPECT_STREQ(phase_name(Phase::kDataWait), "data_wait");
  EXPECT_STREQ(phase_name(Phase::kHostSync), "host_sync");
  EXPECT_STREQ(phase_name(Phase::kOther), "other");
  const PhaseSeconds p = phases(1, 0, 2, 3, 0, 1, 0, 1);
  EXPECT_DOUBLE_EQ(p.total(), 8);
  EXPECT_DOUBLE_EQ(p.share(Phase::kBackward), 3.0 / 8);
  EXPECT_DOUBLE_EQ(PhaseSeconds().share(Phase::kForward), 0);
}

TEST(Breakdown, InputBoundNamesTheDataSettingT12) {
  BottleneckContext c;
  c.loader_threads = 1;
  c.loader_busy = 0.97;
  c.cores = 4;
  c.compute_threads = 2;
  const Bottleneck b = diagnose(phases(4.1, 0.1, 2, 3, 0, 0.7, 0.1), c);
  EXPECT_EQ(b.verdict(), "input-bound");
  EXPECT_NEAR(b.share, 0.41, 1e-9);
  EXPECT_NE(b.evidence.find("41% of step time waiting for data"), std::string::npos) << b.evidence;
  EXPECT_NE(b.fix.find("data.threads to 2"), std::string::npos) << b.fix;  // one idle core
  EXPECT_NE(b.fix.find("97% busy"), std::string::npos) << b.fix;

  c.loader_busy = 0.3;  // idle workers, yet waiting: bursts
  EXPECT_NE(diagnose(phases(4.1, 0.1, 2, 3, 0, 0.7, 0.1), c).fix.find("data.prefetch"), std::string::npos);

  c.loader_busy = 0.99;  // decoding images that fit decoded in memory
  c.dataset = "images";
  c.decoded_cache_gb = 1.2;
  c.free_memory_gb = 20;
  EXPECT_NE(diagnose(phases(4.1, 0, 2, 3, 0, 0.9, 0), c).fix.find("data.cache = \"decoded\" (fits: 1.2 GB of 20.0 GB"),
            std::string::npos);
  c.decoded_cache_gb = 50;  // … and that do not
  EXPECT_NE(diagnose(phases(4.1, 0, 2, 3, 0, 0.9, 0), c).fix.find("crucible pack --max-side"), std::string::npos);
}

TEST(Breakdown, ComputeBoundBelowTheThreshold) {
  BottleneckContext c;
  c.precision = "bf16";
  // 19% waiting for data: not enough to call it input-bound.
  const Bottleneck b = diagnose(phases(1.9, 0, 3, 4, 0, 1.1, 0), c);
  EXPECT_EQ(b.verdict(), "compute-bound");
  EXPECT_NEAR(b.share, 0.81, 1e-9);
  c.precision = "fp32";
  c.native_bf16 = true;
  EXPECT_NE(diagnose(phases(0, 0, 3, 4, 0, 1, 0), c).fix.find("train.precision = \"bf16\""), std::string::npos);
  c.cuda = true;
  EXPECT_NE(diagnose(phases(0, 0, 3, 4, 0, 1, 0), c).fix.find("train.precision = \"auto\""), std::string::npos);
  c.cuda = false;
  c.native_bf16 = false;  // fp32 is already the fastest: no precision to suggest
  const std::string fix = diagnose(phases(0, 0, 3, 4, 0, 1, 0), c).fix;
  EXPECT_EQ(fix.find("train.precision"), std::string::npos) << fix;
  EXPECT_NE(fix.find("no bf16 arithmetic"), std::string::npos) << fix;
  // At the threshold it is input-bound.
  EXPECT_EQ(diagnose(phases(2, 0, 3, 4, 0, 1, 0), c).verdict(), "input-bound");
}

TEST(Breakdown, CommunicationBoundNamesTheBucketSize) {
  BottleneckContext c;
  c.world_size = 2;
  c.bucket_mb = 25;
  const Bottleneck b = diagnose(phases(0.1, 0, 3, 4, 2.3, 0.6, 0), c);
  EXPECT_EQ(b.verdict(), "communication-bound");
  EXPECT_NE(b.evidence.find("23% of the step in gradient communication"), std::string::npos) << b.evidence;
  EXPECT_NE(b.fix.find("dist.bucket_mb (now 25)"), std::string::npos) << b.fix;
}

// Stragglers: the rank that waits least at the gradient sync is the one the others wait for.
// Over 10 steps of 10 s: ranks 0, 2 and 3 wait 3 s, rank 1 0.2 s → rank 1, 2.8 s later (28%):
// the step is communication-bound whatever this rank's phases say, naming rank 1 and 280 ms
// per step. Equal waits, or a difference under 10% of the step (or 1 ms), name nobody.
TEST(Breakdown, TheStragglerIsTheRankThatWaitsLeast) {
  const Straggler s = find_straggler({3.0, 0.2, 3.0, 3.0}, 10.0);
  EXPECT_EQ(s.rank, 1);
  EXPECT_NEAR(s.late_seconds, 2.8, 1e-12);
  EXPECT_EQ(find_straggler({3.0, 3.0}, 10.0).rank, -1);
  EXPECT_EQ(find_straggler({1.0, 0.1}, 10.0).rank, -1);      // 9% of the period
  EXPECT_EQ(find_straggler({0.0009, 0.0}, 0.001).rank, -1);  // under 1 ms
  EXPECT_EQ(find_straggler({3.0}, 10.0).rank, -1);           // one process
  BottleneckContext c;
  c.world_size = 4;
  c.sync_wait = {3.0, 0.2, 3.0, 3.0};
  c.steps = 10;
  const Bottleneck b = diagnose(phases(0, 0, 4, 4, 0.5, 1.5, 0), c);  // this rank: 5% communication
  EXPECT_EQ(b.verdict(), "communication-bound");
  EXPECT_NEAR(b.share, 0.28, 1e-12);
  EXPECT_NE(b.evidence.find("wait 280.0 ms per step (28% of the step) at the gradient sync for rank 1, the straggler"),
            std::string::npos)
      << b.evidence;
  EXPECT_NE(b.fix.find("rank 1"), std::string::npos) << b.fix;
  c.sync_wait = {0.5, 0.5, 0.5, 0.5};
  EXPECT_EQ(diagnose(phases(0, 0, 4, 4, 0.5, 1.5, 0), c).verdict(), "compute-bound");
}

TEST(Breakdown, TheLargestOverheadWins) {
  BottleneckContext c;
  EXPECT_EQ(diagnose(phases(2.5, 0, 1, 1, 3.5, 0, 2), c).verdict(), "communication-bound");
  EXPECT_EQ(diagnose(phases(0, 3, 1, 1, 0, 0, 0), c).verdict(), "transfer-bound");
  c.log_every_steps = 1;
  const Bottleneck h = diagnose(phases(0, 0, 1, 1, 0, 0, 3), c);
  EXPECT_EQ(h.verdict(), "host-sync-bound");
  EXPECT_NE(h.fix.find("log.every_steps (now 1)"), std::string::npos) << h.fix;
  c.sync_debug = true;
  EXPECT_NE(diagnose(phases(0, 0, 1, 1, 0, 0, 3), c).fix.find("train.sync_debug"), std::string::npos);
  // Bookkeeping counts toward no verdict.
  EXPECT_EQ(diagnose(phases(0, 0, 1, 1, 0, 0, 0, 5), c).verdict(), "compute-bound");
}

}  // namespace
}  // namespace crucible::obs
