// Progress: durations format as a person reads them; modes parse; lines mode prints one line
// per reading (checked through the log to stdout).
#include "crucible/obs/progress.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"

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
    p.reading({10, 0.5, 0.75, 0.001, 1234}, 0);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("epoch 1/2 step 10/20"), std::string::npos) << out;
  EXPECT_NE(out.find("loss 0.5000"), std::string::npos) << out;
  EXPECT_NE(out.find("acc 75.00%"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_EQ(out.find('\r'), std::string::npos);  // no bar redraws off a terminal
}

}  // namespace
}  // namespace crucible::obs
