// The Trainer in-process: an injected out-of-memory at step k is survived by splitting the
// batch (T16, D5) — the run completes, the log names the step and the split, and the result is
// close to an unfaulted run; precision "auto" picks the fastest candidate it timed.
#include "crucible/train/trainer.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "test_util.h"

namespace crucible::train {
namespace {

JobConfig small_job(const std::string& dir, const std::string& name) {
  JobConfig j;
  j.run.dir = dir;
  j.run.name = name;
  j.data.train_samples = 8192;
  j.train.epochs = 2;
  j.log.progress = "none";
  return j;
}

TEST(Trainer, SurvivesAnInjectedOutOfMemoryT16) {
  test::TempDir d;
  const TrainSummary plain = Trainer(small_job(d.path(), "plain")).run();
  testing::inject_oom(/*step=*/5, /*max_micro_batch=*/64);
  ::testing::internal::CaptureStderr();
  const TrainSummary faulted = Trainer(small_job(d.path(), "faulted")).run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  testing::inject_oom(-1, 0);
  EXPECT_NE(err.find("step 5: out of memory with micro-batches of 256 samples"), std::string::npos) << err;
  EXPECT_NE(err.find("as 2 micro-batches"), std::string::npos) << err;
  EXPECT_NE(err.find("as 4 micro-batches of about 64"), std::string::npos) << err;
  EXPECT_EQ(faulted.steps, plain.steps);
  EXPECT_NEAR(faulted.test_acc, plain.test_acc, 0.003);
  std::printf("test accuracy: unfaulted %.4f, OOM at step 5 %.4f\n", plain.test_acc, faulted.test_acc);
}

TEST(Trainer, OneSampleThatDoesNotFitNamesTheSamples) {
  test::TempDir d;
  testing::inject_oom(/*step=*/2, /*max_micro_batch=*/0);
  ::testing::internal::CaptureStderr();
  try {
    Trainer(small_job(d.path(), "hopeless")).run();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("out of memory with a single sample (sample ids"), std::string::npos)
        << e.what();
  }
  ::testing::internal::GetCapturedStderr();
  testing::inject_oom(-1, 0);
}

TEST(Trainer, AutoPrecisionPicksTheFastestItTimed) {
  test::TempDir d;
  JobConfig j = small_job(d.path(), "auto");
  j.train.precision = "auto";
  j.train.max_steps = 2;
  ::testing::internal::CaptureStdout();
  const TrainSummary s = Trainer(j).run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("precision auto: forward\\+backward of a batch of \\d+: (.*) → (\\w+) \\+ (\\w+)")))
      << out;
  // The pick has the smallest time in the printed table (two candidates may print the same
  // time at 0.1 ms: the pick is then either of them).
  std::regex entry("(\\w+) (channels_last|contiguous) ([0-9.]+) ms");
  std::string table = m[1];
  const std::string picked = m[2].str() + " " + m[3].str();
  double best = 1e30, picked_ms = -1;
  for (std::sregex_iterator it(table.begin(), table.end(), entry), end; it != end; ++it) {
    const double ms = std::stod((*it)[3]);
    best = std::min(best, ms);
    if ((*it)[1].str() + " " + (*it)[2].str() == picked) picked_ms = ms;
  }
  ASSERT_GE(picked_ms, 0) << "the pick " << picked << " is not in the table: " << table;
  EXPECT_EQ(picked_ms, best) << table;
  EXPECT_NE(table.find("bf16"), std::string::npos);  // a candidate wherever bf16 autocast exists
  std::printf("%s\n", m[0].str().c_str());
  (void)s;
}

}  // namespace
}  // namespace crucible::train
