// ConfigSchema: every key is checked (unknown, wrong type, out of range), overrides parse as
// TOML, and the rendered config reads back to the same values. Add a case as a TEST below.
#include "crucible/core/config.h"

#include <gtest/gtest.h>
#include <utility>
#include <vector>

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


// Enum keys: a string in the file, an enum in the field from parsing onwards; the spellings are
// the allowed values, the rendered config prints the spelling back.
TEST(Config, EnumKeysParseToTheirValueAndRenderBack) {
  enum class Colour { kRed, kGreen, kBlue };
  Colour c = Colour::kGreen;
  ConfigSchema schema;
  schema.add_enum("s", "colour", &c, {{"red", Colour::kRed}, {"green", Colour::kGreen}, {"blue", Colour::kBlue}},
                  "a colour");
  EXPECT_NE(schema.find("s", "colour")->default_toml().find("green"), std::string::npos);
  schema.apply_override("s.colour=blue");
  EXPECT_EQ(c, Colour::kBlue);
  EXPECT_NE(schema.to_toml().find("colour = \"blue\""), std::string::npos) << schema.to_toml();
  expect_bad_input([&] { schema.apply_override("s.colour=purple"); }, {"s.colour", "purple", "red", "green", "blue"});
  EXPECT_EQ(c, Colour::kBlue);  // a refused value leaves the field as it was
}

// train.precision, train.loss_scaling and dist.bn are enums; the resolved config of the default
// values reads back to the same values.
TEST(Config, JobEnumKeysRoundTrip) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  schema.apply_override("train.precision=auto");
  schema.apply_override("train.loss_scaling=off");
  schema.apply_override("dist.bn=sync");
  EXPECT_EQ(job.train.precision, train::PrecisionMode::kAuto);
  EXPECT_EQ(job.train.loss_scaling, train::TrainSection::LossScaling::kOff);
  EXPECT_EQ(job.dist.bn, train::DistSection::Bn::kSync);
  train::JobConfig again;
  ConfigSchema schema2;
  train::bind_job_config(again, schema2);
  schema2.load_string(schema.to_toml(), "resolved");
  EXPECT_EQ(schema2.values(), schema.values());
  expect_bad_input([&] { schema.apply_override("train.precision=fp8"); }, {"train.precision", "fp8", "bf16"});
}

// The settings registries' names are the allowed values of model.name / loss.name / optim.name
// / schedule.name, in torch-free tools too.
TEST(Config, RegisteredNamesAreTheAllowedValues) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  schema.apply_override("model.name=resnet34");
  EXPECT_EQ(job.model.name, "resnet34");
  expect_bad_input([&] { schema.apply_override("model.name=net_c"); }, {"model.name", "fmnist_cnn", "resnet50"});
  expect_bad_input([&] { schema.apply_override("loss.name=mse"); }, {"loss.name", "cross_entropy"});
  expect_bad_input([&] { schema.apply_override("optim.name=lamb"); }, {"optim.name", "adamw", "sgd"});
  expect_bad_input([&] { schema.apply_override("schedule.name=poly"); }, {"schedule.name", "onecycle", "exponential"});
  for (const auto& [section, names] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"model", nn::model_settings_registry().names()},
           {"loss", train::loss_settings_registry().names()},
           {"optim", train::optimizer_settings_registry().names()},
           {"schedule", train::schedule_registry().names()}}) {
    for (const auto& name : names) {
      EXPECT_NO_THROW(schema.apply_override(section + ".name=" + name)) << section << ".name=" << name;
    }
  }
}

// Precision prints and parses back (the broadcast of an auto choice, checkpoints).
TEST(Config, PrecisionParsesWhatItPrints) {
  using train::ComputeDtype;
  using train::Precision;
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    for (bool cl : {false, true}) {
      const Precision p{d, cl};
      EXPECT_EQ(Precision::parse(p.to_string(), "test"), p) << p.to_string();
      EXPECT_EQ(Precision::from_fields(p.dtype_name(), p.memory_format_name(), "test"), p);
    }
  }
  EXPECT_EQ(Precision::parse("bf16 channels_last", "x").to_string(), "bf16 channels_last");
  expect_bad_input([] { Precision::parse("bf16+cl", "rank 0"); }, {"rank 0", "bf16+cl"});
  expect_bad_input([] { Precision::from_fields("fp8", "contiguous", "ckpt.safetensors"); }, {"ckpt.safetensors", "fp8"});
}


// String lists (model.freeze, model.init_ignore): TOML arrays of strings, a bare word from
// --set as a one-element list, [] as empty; rendered back as TOML that reads the same.
TEST(Config, StringListsParseRenderAndRefuseMixedLists) {
  std::vector<std::string> names = {"a*"};
  ConfigSchema schema;
  schema.add("m", "freeze", &names, "patterns");
  schema.apply_override("m.freeze=[\"conv1.*\", \"layer1.*\"]");
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.*", "layer1.*"}));
  EXPECT_NE(schema.to_toml().find("freeze = [\"conv1.*\", \"layer1.*\"]"), std::string::npos) << schema.to_toml();
  schema.apply_override("m.freeze=fc.*");
  EXPECT_EQ(names, (std::vector<std::string>{"fc.*"}));
  schema.apply_override("m.freeze=[]");
  EXPECT_TRUE(names.empty());
  schema.load_string("[m]\nfreeze = [\"x\"]\n", "f.toml");
  EXPECT_EQ(names, (std::vector<std::string>{"x"}));
  expect_bad_input([&] { schema.load_string("[m]\nfreeze = [\"x\", 2]\n", "g.toml"); }, {"g.toml", "list of strings"});
  expect_bad_input([&] { schema.load_string("[m]\nfreeze = [1, 2]\n", "h.toml"); }, {"h.toml", "m.freeze", "list of strings"});
}

}  // namespace
}  // namespace crucible
