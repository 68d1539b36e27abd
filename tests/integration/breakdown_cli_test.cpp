// The step-time breakdown and the bottleneck verdict on three engineered runs (T12, X6):
// - data made slow through the loader's test seam (a per-sample read delay) → input-bound,
//   and the fix names a data setting;
// - the default job → compute-bound; train.profile = "off" trains to the same weights;
// - 2 ranks with a delay injected into the gradient all-reduce → communication-bound.
// - train.profile = "full" adds each layer's forward and backward time.
// In every run the phases' shares of each interval's measured step time add up to 1 ± 2%.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;

constexpr const char* kPhases[] = {"data_wait",     "transfer",  "forward",   "backward",
                                   "communication", "optimizer", "host_sync", "other"};

std::vector<json> train_records(const std::string& run) {
  std::vector<json> out;
  std::istringstream lines(test::read_text(run + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line);
    if (j["type"] == "train") out.push_back(std::move(j));
  }
  return out;
}

double share_sum(const json& shares) {
  double sum = 0;
  for (const char* p : kPhases) {
    EXPECT_TRUE(shares.contains(p)) << "no phase " << p << " in " << shares.dump();
    if (shares.contains(p)) sum += shares[p].get<double>();
  }
  EXPECT_EQ(shares.size(), std::size(kPhases)) << shares.dump();
  return sum;
}

// Every interval's shares add up to its measured step time within 2%, and so do the run's.
void expect_breakdown_adds_up(const std::string& run) {
  const std::vector<json> records = train_records(run);
  ASSERT_FALSE(records.empty());
  for (const json& r : records) {
    ASSERT_TRUE(r.contains("breakdown")) << r.dump();
    EXPECT_NEAR(share_sum(r["breakdown"]), 1.0, 0.02) << r.dump();
  }
  const json s = json::parse(test::read_text(run + "/summary.json"));
  const json& b = s["breakdown"];
  ASSERT_TRUE(b.is_object()) << s.dump(2);
  EXPECT_NEAR(share_sum(b["shares"]), 1.0, 0.02) << b.dump();
  double seconds = 0;
  for (const char* p : kPhases) seconds += b["phases"][p].get<double>();
  EXPECT_NEAR(seconds, b["step_seconds"].get<double>(), 0.02 * b["step_seconds"].get<double>());
  // The run's step time is what summary.json always reported (every step, no evaluation).
  EXPECT_DOUBLE_EQ(b["step_seconds"].get<double>(), s["step_seconds"].get<double>());
}

std::vector<std::string> short_job(const test::TempDir& dir, const std::string& name) {
  return {test::crucible_binary(),
          "train",
          "--set",
          "run.dir=" + dir.path(),
          "--set",
          "run.name=" + name,
          "--set",
          "data.train_samples=6000",
          "--set",
          "data.test_samples=1000",
          "--set",
          "train.max_steps=40",
          "--set",
          "log.every_steps=10",
          "--set",
          "log.progress=lines",
          "--restart"};
}

std::vector<std::string> with_env(const std::string& var, std::vector<std::string> cmd) {
  cmd.insert(cmd.begin(), {"/usr/bin/env", var});
  return cmd;
}

TEST(BreakdownCli, SlowDataIsInputBoundAndTheFixNamesADataSettingT12) {
  test::TempDir d;
  // 250 ms a sample, batch 4: a second of loading a step against milliseconds of compute, so
  // input-bound even when a parallel ctest slows the step 40x (seen: 60 ms of compute a sample).
  std::vector<std::string> cmd = with_env("CRUCIBLE_TEST_SAMPLE_DELAY_MS=250", short_job(d, "slow"));
  for (const char* s : {"train.max_steps=22", "log.every_steps=5", "data.threads=1", "train.batch_size=4"}) {
    cmd.insert(cmd.end(), {"--set", s});
  }
  const auto r = test::run_command(cmd);  // 22 steps: the last 2 after the last log interval
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_breakdown_adds_up(d / "slow");
  const json s = json::parse(test::read_text(d / "slow/summary.json"));
  EXPECT_EQ(s["bottleneck"]["verdict"], "input-bound") << s["bottleneck"].dump();
  EXPECT_GT(s["breakdown"]["shares"]["data_wait"].get<double>(), 0.5) << s["breakdown"].dump();
  const std::string fix = s["bottleneck"]["fix"];
  EXPECT_NE(fix.find("data."), std::string::npos) << fix;
  // The loader's one thread slept in every sample: it was busy, and the evidence says so.
  EXPECT_NE(fix.find("1 thread(s) were"), std::string::npos) << fix;
  // Live: every interval's record and progress line carry it.
  for (const json& rec : train_records(d / "slow")) EXPECT_EQ(rec["verdict"], "input-bound") << rec.dump();
  expect_contains(r.out + r.err, "samples/s  input-bound");
  expect_contains(r.out + r.err, "bottleneck: input-bound: ");
}

TEST(BreakdownCli, TheDefaultJobIsComputeBoundAndProfilingChangesNothingT12) {
  test::TempDir d;
  // The default job's recipe (batch 256), 20 steps of it.
  auto twenty = [](std::vector<std::string> cmd) {
    cmd.insert(cmd.end(), {"--set", "train.max_steps=20", "--set", "log.every_steps=5"});
    return cmd;
  };
  const auto r = test::run_command(twenty(short_job(d, "light")));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_breakdown_adds_up(d / "light");
  const json s = json::parse(test::read_text(d / "light/summary.json"));
  EXPECT_EQ(s["bottleneck"]["verdict"], "compute-bound") << s["bottleneck"].dump();
  const json& shares = s["breakdown"]["shares"];
  EXPECT_GT(shares["forward"].get<double>() + shares["backward"].get<double>() + shares["optimizer"].get<double>(), 0.8)
      << shares.dump();
  EXPECT_EQ(shares["communication"].get<double>(), 0.0);  // one process: nothing to wait for
  for (const json& rec : train_records(d / "light")) EXPECT_EQ(rec["verdict"], "compute-bound") << rec.dump();
  // The environment as `crucible doctor`'s quick checks saw it at start, in the summary and in the
  // run's report, which also shows the verdict (report_browser_test.py renders it).
  std::set<std::string> checks;
  for (const json& c : s["doctor"]) checks.insert(c["name"].get<std::string>());
  EXPECT_EQ(checks, (std::set<std::string>{"bf16", "cores", "cuda", "libtorch", "memory"})) << s["doctor"].dump();
  const std::string report = test::read_text(d / "light/report.html");
  expect_contains(report, "compute-bound");
  expect_contains(report, s["doctor"][0]["found"].get<std::string>().substr(0, 20));

  std::vector<std::string> off = twenty(short_job(d, "off"));
  off.insert(off.end(), {"--set", "train.profile=off"});
  const auto o = test::run_command(off);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  const json so = json::parse(test::read_text(d / "off/summary.json"));
  EXPECT_TRUE(so["breakdown"].is_null());
  EXPECT_TRUE(so["bottleneck"].is_null());
  for (const json& rec : train_records(d / "off")) EXPECT_FALSE(rec.contains("breakdown")) << rec.dump();
  EXPECT_EQ(so["params_sha256"], s["params_sha256"]) << "timing the step changed what it computed";
}

// train.profile = "full": every layer of the default model gets its forward and its backward
// (each backward node given to the layer whose forward made it), the layers' times fit inside the
// breakdown's forward and backward phases, and the weights are those of a "light" run.
TEST(BreakdownCli, FullProfileTimesEachLayerAndChangesNothingT12) {
  test::TempDir d;
  auto job = [&](const std::string& name, const char* profile) {
    std::vector<std::string> cmd = short_job(d, name);
    for (const char* s : {"train.max_steps=12", "log.every_steps=4", "train.batch_size=64"}) {
      cmd.insert(cmd.end(), {"--set", s});
    }
    cmd.insert(cmd.end(), {"--set", std::string("train.profile=") + profile});
    return cmd;
  };
  const auto r = test::run_command(job("full", "full"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_breakdown_adds_up(d / "full");
  const json s = json::parse(test::read_text(d / "full/summary.json"));
  const json& layers = s["layers"];
  ASSERT_TRUE(layers.is_array()) << s.dump(2);
  std::vector<std::string> names;
  double forward = 0, backward = 0, outside = 0;
  for (const json& l : layers) {
    names.push_back(l["name"]);
    forward += l["forward_seconds"].get<double>();
    backward += l["backward_seconds"].get<double>();
    if (l["name"] == "(outside layers)") {
      outside = l["backward_seconds"].get<double>();
      continue;
    }
    EXPECT_GT(l["forward_seconds"].get<double>(), 0) << l.dump();
    EXPECT_GT(l["backward_seconds"].get<double>(), 0) << l.dump();  // its backward nodes were found
    EXPECT_NEAR(l["forward_ms_per_step"].get<double>(), 1e3 * l["forward_seconds"].get<double>() / 12, 1e-9);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "conv2", "conv3", "conv4", "fc1", "fc2", "(outside layers)"}));
  // The layers ran inside the step's forward and backward phases, and fill most of them.
  const json& phases = s["breakdown"]["phases"];
  const double fwd_phase = phases["forward"].get<double>(), bwd_phase = phases["backward"].get<double>();
  EXPECT_LE(forward, fwd_phase * 1.02) << s["breakdown"].dump();
  EXPECT_GT(forward, fwd_phase * 0.6) << s["breakdown"].dump();
  EXPECT_LE(backward, bwd_phase * 1.02) << s["breakdown"].dump();
  EXPECT_GT(backward, bwd_phase * 0.6) << s["breakdown"].dump();
  // Most backward time belongs to a layer: outside are only the loss's nodes and the gradient
  // accumulation (a broken forward/backward match puts everything there).
  EXPECT_LT(outside, 0.2 * backward) << layers.dump();
  expect_contains(r.out + r.err, "time by layer a step, forward+backward: conv1 ");
  const std::string report = test::read_text(d / "full/report.html");
  expect_contains(report, "Time by layer");
  expect_contains(report, "<td>conv4</td>");

  const auto l = test::run_command(job("light", "light"));
  ASSERT_EQ(l.exit_code, 0) << l.out << l.err;
  const json sl = json::parse(test::read_text(d / "light/summary.json"));
  EXPECT_TRUE(sl["layers"].is_null());
  EXPECT_EQ(sl["params_sha256"], s["params_sha256"]) << "profiling the layers changed what the step computed";
}

TEST(BreakdownCli, TwoRanksWithASlowAllReduceAreCommunicationBoundT12) {
  test::TempDir d;
  std::vector<std::string> train = short_job(d, "comm");
  for (const char* s : {"train.max_steps=16", "log.every_steps=4", "train.batch_size=4", "dist.bucket_mb=25"}) {
    train.insert(train.end(), {"--set", s});
  }
  // 400 ms a step against milliseconds of compute for 4 samples a rank: communication-bound even
  // on a loaded machine.
  std::vector<std::string> cmd = {
      "/usr/bin/env", "CRUCIBLE_TEST_ALLREDUCE_DELAY_MS=400", test::crucible_binary(), "launch", "--nproc", "2", "--"};
  cmd.insert(cmd.end(), train.begin(), train.end());  // `crucible launch … -- crucible train …`
  const auto r = test::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_breakdown_adds_up(d / "comm");
  const json s = json::parse(test::read_text(d / "comm/summary.json"));
  EXPECT_EQ(s["bottleneck"]["verdict"], "communication-bound") << s["bottleneck"].dump();
  EXPECT_NE(s["bottleneck"]["fix"].get<std::string>().find("dist.bucket_mb (now 25)"), std::string::npos)
      << s["bottleneck"].dump();
  EXPECT_GT(s["breakdown"]["shares"]["communication"].get<double>(), 0.3) << s["breakdown"].dump();
}

}  // namespace
}  // namespace crucible
