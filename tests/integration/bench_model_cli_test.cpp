// `crucible bench model` (X9): every precision and memory format `precision = "auto"` considers,
// forward and the whole training step each; warm-up runs not counted; median/p90 consistent with
// the counted runs; a memory peak that includes what training keeps (the step's exceeds the
// forward's); --job-precision narrows to the job's own; bad options exit 2.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;

json last_json_line(const std::string& out) {
  const size_t at = out.rfind("\n{");
  return json::parse(out.substr(at == std::string::npos ? 0 : at + 1));
}

std::vector<std::string> bench(std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(),
                                  "bench",
                                  "model",
                                  "--batch",
                                  "16",
                                  "--warmup",
                                  "2",
                                  "--repeats",
                                  "5",
                                  "--seconds",
                                  "3",
                                  "--json",
                                  "--set",
                                  "data.train_samples=512",
                                  "--set",
                                  "data.test_samples=64"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

TEST(BenchModelCli, EveryCandidateForwardAndStepWithMedianP90AndPeakX9) {
  const auto r = test::run_command(bench({}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = last_json_line(r.out);
  EXPECT_EQ(j["batch"], 16);
  EXPECT_EQ(j["warmup"], 2);
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  std::map<std::string, int64_t> forward_peak, step_peak;
  for (const json& row : j["rows"]) {
    const std::string key = row["precision"].get<std::string>() + " " + row["memory_format"].get<std::string>();
    seen.insert(
        {row["precision"].get<std::string>(), row["memory_format"].get<std::string>(), row["what"].get<std::string>()});
    const int runs = row["runs"];
    EXPECT_GE(runs, 3) << row.dump();
    EXPECT_LE(runs, 5) << row.dump();  // the 2 warm-up runs are not counted
    const double min = row["min_ms"], median = row["median_ms"], p90 = row["p90_ms"];
    EXPECT_GT(min, 0) << row.dump();
    EXPECT_LE(min, median) << row.dump();
    EXPECT_LE(median, p90) << row.dump();
    EXPECT_NEAR(row["samples_per_s"].get<double>(), 1000.0 * 16 / median, 1e-6 * row["samples_per_s"].get<double>());
    EXPECT_GT(row["peak_bytes"].get<int64_t>(), 0) << row.dump();
    (row["what"] == "forward" ? forward_peak : step_peak)[key] = row["peak_bytes"].get<int64_t>();
  }
  // fp32 and bf16 (libtorch has CPU bf16 autocast), each contiguous and channels_last.
  std::set<std::tuple<std::string, std::string, std::string>> expected;
  for (const char* p : {"fp32", "bf16"}) {
    for (const char* f : {"contiguous", "channels_last"}) {
      for (const char* w : {"forward", "train_step"}) expected.insert({p, f, w});
    }
  }
  EXPECT_EQ(seen, expected) << j.dump(2);
  // Training keeps activations, gradients and AdamW's two moments: more than inference's peak.
  for (const auto& [k, fwd] : forward_peak) EXPECT_GT(step_peak[k], fwd) << k;
  EXPECT_NE(r.out.find("median ms"), std::string::npos) << r.out;  // the table
}

TEST(BenchModelCli, JobPrecisionOnlyAndBadOptionsExitTwo) {
  const auto r = test::run_command(
      bench({"--job-precision", "--set", "train.precision=fp32", "--set", "train.channels_last=false"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = last_json_line(r.out);
  ASSERT_EQ(j["rows"].size(), 2u) << j.dump(2);
  for (const json& row : j["rows"]) {
    EXPECT_EQ(row["precision"], "fp32");
    EXPECT_EQ(row["memory_format"], "contiguous");
  }
  const auto bad = test::run_command({test::crucible_binary(), "bench", "model", "--repeats", "2"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  test::expect_contains(bad.err, "--repeats");
}

}  // namespace
}  // namespace crucible
