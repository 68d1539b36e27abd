// Progress: durations format as a person reads them; modes parse; lines mode prints one line
// per reading (checked through the log to stdout).
#include "crucible/obs/progress.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/obs/metric_sink.h"
#include "test_util.h"

namespace crucible::obs {
namespace {

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(Progress::format_duration(0), "0:00");
  EXPECT_EQ(Progress::format_duration(83), "1:23");
  EXPECT_EQ(Progress::format_duration(3723), "1:02:03");
  EXPECT_EQ(Progress::format_duration(-1), "?");
}

TEST(Progress, ParsesModes) {
  EXPECT_EQ(parse_progress_mode("auto", true), ProgressMode::kBar);
  EXPECT_EQ(parse_progress_mode("auto", false), ProgressMode::kLines);
  EXPECT_EQ(parse_progress_mode("none", true), ProgressMode::kNone);
  EXPECT_THROW(parse_progress_mode("fancy", true), Error);
}

TEST(Progress, LinesModePrintsOneLinePerReading) {
  testing::internal::CaptureStdout();
  {
    Progress p(ProgressMode::kLines, 2, 10, 20);
    for (int s = 1; s <= 10; ++s) p.step_done(s, 0);
    p.reading({10, 0.5, 0.75, 0.001, 1234, ""}, 0);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("epoch 1/2 step 10/20"), std::string::npos) << out;
  EXPECT_NE(out.find("loss 0.5000"), std::string::npos) << out;
  EXPECT_NE(out.find("acc 75.00%"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_EQ(out.find('\r'), std::string::npos);  // no bar redraws off a terminal
}


// MetricSinks hands every record to every sink, in the order added: the JSONL sink writes each
// record as one line, the progress sink turns a "train" record into a reading (and ignores
// "eval" ones), and a sink of its own (as TensorBoard will be) sees the same records.
TEST(MetricSink, FanOutReachesEverySinkWithTheSameRecords) {
  struct Counting final : MetricSink {
    std::vector<std::string> types;
    int64_t steps = 0, pauses = 0;
    void write(const nlohmann::json& r) override { types.push_back(r.at("type").get<std::string>()); }
    void step_done(int64_t, int64_t) override { ++steps; }
    void pause() override { ++pauses; }
  };
  test::TempDir d;
  const std::string path = d.path() + "/metrics.jsonl";
  auto counting = std::make_unique<Counting>();
  Counting* seen = counting.get();
  testing::internal::CaptureStdout();
  {
    MetricSinks sinks;
    sinks.add(std::make_unique<JsonlSink>(path));
    sinks.add(std::make_unique<ProgressSink>(ProgressMode::kLines, 1, 10, 10));
    sinks.add(std::move(counting));
    for (int s = 1; s <= 10; ++s) sinks.step_done(s, 0);
    sinks.write({{"type", "train"}, {"step", 10}, {"epoch", 0}, {"loss", 0.25}, {"acc", 0.5}, {"lr", 0.1},
                 {"samples_per_s", 99.0}});
    sinks.pause();
    sinks.write({{"type", "eval"}, {"step", 10}, {"test_acc", 0.9}});
    EXPECT_EQ(seen->types, (std::vector<std::string>{"train", "eval"}));
    EXPECT_EQ(seen->steps, 10);
    EXPECT_EQ(seen->pauses, 1);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("loss 0.2500"), std::string::npos) << out;
  EXPECT_NE(out.find("acc 50.00%"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;  // the eval record draws nothing
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["loss"].get<double>(), 0.25);
  EXPECT_EQ(lines[1]["test_acc"].get<double>(), 0.9);
}

}  // namespace
}  // namespace crucible::obs
