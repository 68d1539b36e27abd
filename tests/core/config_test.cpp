// ConfigSchema: every key is checked (unknown, wrong type, out of range), overrides parse as
// TOML, and the rendered config reads back to the same values. Add a case as a TEST below.
#include "crucible/core/config.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/train/job_config.h"
#include "test_util.h"

namespace crucible {
namespace {

struct Fixture {
  bool flag = true;
  int64_t count = 3;
  double rate = 0.5;
  std::string mode = "a";
  std::vector<double> mean = {0.1, 0.2};
  ConfigSchema schema;
  Fixture() {
    schema.add("s", "flag", &flag, "a flag");
    schema.add("s", "count", &count, "a count").min(1);
    schema.add("s", "rate", &rate, "a rate").positive();
    schema.add("t", "mode", &mode, "a mode").choices({"a", "b"});
    schema.add("t", "mean", &mean, "means").min(0).max(1);
  }
};

using test::expect_bad_input;

TEST(Config, LoadsValuesAndIntegersAsFloats) {
  Fixture f;
  f.schema.load_string("[s]\nflag = false\ncount = 7\nrate = 2\n[t]\nmode = \"b\"\nmean = [0.5]\n", "x.toml");
  EXPECT_FALSE(f.flag);
  EXPECT_EQ(f.count, 7);
  EXPECT_DOUBLE_EQ(f.rate, 2.0);
  EXPECT_EQ(f.mode, "b");
  EXPECT_EQ(f.mean, std::vector<double>{0.5});
}

TEST(Config, UnknownKeyNamesKeyAndSuggests) {
  Fixture f;
  expect_bad_input([&] { f.schema.load_string("[s]\ncuont = 2\n", "x.toml"); },
                   {"x.toml:2", "s.cuont", "did you mean 'count'", "flag, count, rate"});
}

TEST(Config, UnknownSection) {
  Fixture f;
  expect_bad_input([&] { f.schema.load_string("[u]\na = 1\n", "x.toml"); }, {"unknown section [u]", "s, t"});
}

TEST(Config, WrongTypeNamesKeyAndExpected) {
  Fixture f;
  expect_bad_input([&] { f.schema.load_string("[s]\ncount = 1.5\n", "x.toml"); }, {"s.count", "expected integer", "1.5"});
  expect_bad_input([&] { f.schema.load_string("[s]\nflag = \"yes\"\n", "x.toml"); }, {"s.flag", "boolean"});
}

TEST(Config, OutOfRangeNamesKeyAndRange) {
  Fixture f;
  expect_bad_input([&] { f.schema.load_string("[s]\nrate = -0.1\n", "x.toml"); }, {"s.rate", "-0.1", "> 0"});
  expect_bad_input([&] { f.schema.load_string("[s]\ncount = 0\n", "x.toml"); }, {"s.count", ">= 1"});
  expect_bad_input([&] { f.schema.load_string("[t]\nmean = [0.5, 2.0]\n", "x.toml"); }, {"t.mean", "[0, 1]"});
  expect_bad_input([&] { f.schema.load_string("[t]\nmode = \"c\"\n", "x.toml"); }, {"t.mode", "\"a\", \"b\""});
}

TEST(Config, InvalidTomlNamesLine) {
  Fixture f;
  expect_bad_input([&] { f.schema.load_string("[s]\ncount = = 2\n", "x.toml"); }, {"x.toml:2", "invalid TOML"});
}

TEST(Config, OverridesParseAsTomlAndBareStrings) {
  Fixture f;
  f.schema.apply_override("s.count=12");
  f.schema.apply_override("s.rate=1e-3");
  f.schema.apply_override("t.mode=b");
  f.schema.apply_override("t.mean=[0.25, 0.75]");
  f.schema.apply_override("s.flag=false");
  EXPECT_EQ(f.count, 12);
  EXPECT_DOUBLE_EQ(f.rate, 1e-3);
  EXPECT_EQ(f.mode, "b");
  EXPECT_EQ(f.mean, (std::vector<double>{0.25, 0.75}));
  EXPECT_FALSE(f.flag);
  expect_bad_input([&] { f.schema.apply_override("s.rate=-1"); }, {"s.rate", "> 0"});
  expect_bad_input([&] { f.schema.apply_override("s.count=abc"); }, {"s.count"});
  expect_bad_input([&] { f.schema.apply_override("s.nope=1"); }, {"s.nope"});
  expect_bad_input([&] { f.schema.apply_override("count=1"); }, {"section.key=value"});
}

TEST(Config, RenderedTomlReadsBackIdentically) {
  Fixture a;
  a.schema.load_string("[s]\ncount = 9\nrate = 0.1\n[t]\nmode = \"b\"\nmean = [0.3, 0.7]\n", "x.toml");
  const std::string text = a.schema.to_toml();
  Fixture b;
  b.schema.load_string(text, "rendered");
  EXPECT_EQ(a.schema.values(), b.schema.values());
}

TEST(Config, JobConfigDefaultsRoundTripAndHelpListsEveryKey) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  const std::string help = schema.help_text();
  for (const auto& [name, value] : schema.values()) {
    const std::string key = name.substr(name.find('.') + 1);
    EXPECT_NE(help.find(key), std::string::npos) << name;
  }
  train::JobConfig job2;
  ConfigSchema schema2;
  train::bind_job_config(job2, schema2);
  schema2.load_string(schema.to_toml(), "rendered");
  EXPECT_EQ(schema.values(), schema2.values());
}

TEST(Config, JobConfigRejectsNegativeLearningRate) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  expect_bad_input([&] { schema.load_string("[optim]\nlr = -0.001\n", "job.toml"); }, {"optim.lr", "> 0"});
}

}  // namespace
}  // namespace crucible
