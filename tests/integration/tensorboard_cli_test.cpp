// TensorBoard from a real run, read back by an independent reader (Debian's python3-protobuf and
// python3-crc32c: tests/support/read_tfevents.py): every number of every metrics.jsonl record is
// a scalar "<type>/<key>" at its step with the same value (as float32), and nothing else is; the
// resolved config is the text; weights and gradients have histograms every log.histogram_every
// steps, each counting every element; all CRCs verify. A run resumed from a checkpoint older than
// its last events rewrites those steps once, not twice. --restart starts the folder afresh;
// log.tensorboard = false writes none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;

std::vector<std::string> with_args(std::vector<std::string> cmd, std::initializer_list<std::string> extra) {
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<std::string> tb_run(const test::TempDir& d, int max_steps, std::initializer_list<std::string> extra = {}) {
  std::vector<std::string> cmd = {test::crucible_binary(), "train",
                                  "--set", "run.dir=" + d.path(),
                                  "--set", "run.name=tb",
                                  "--set", "data.train_samples=4096",
                                  "--set", "data.test_samples=500",
                                  "--set", "train.epochs=2",
                                  "--set", "train.batch_size=128",
                                  "--set", "train.max_steps=" + std::to_string(max_steps),
                                  "--set", "checkpoint.every_steps=10",
                                  "--set", "log.every_steps=5",
                                  "--set", "log.histogram_every=10"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(test::read_text(path));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

// The run's parameters (not buffers) and their element counts, from its newest checkpoint's
// safetensors header ("model.<name>").
std::map<std::string, int64_t> parameter_sizes(const std::string& run) {
  std::string newest;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && n.find(".tmp-") == std::string::npos) newest = std::max(newest, e.path().string());
  }
  const json sizes = json::parse(test::run_python(
      test::python_read_safetensors(newest) +
      "import json, math\n"
      "buffers = ('running_mean', 'running_var', 'num_batches_tracked')\n"
      "print(json.dumps({k[6:]: math.prod(v['shape']) for k, v in h.items()\n"
      "                  if k.startswith('model.') and not k.endswith(buffers)}))\n"));
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : sizes.items()) out[k] = v.get<int64_t>();
  return out;
}

// Every scalar equals metrics.jsonl, one per (tag, step), and the histograms are complete.
void expect_tb_matches_run(const std::string& run, int64_t last_step, size_t sessions) {
  const json tb = test::read_tfevents(run + "/tb");
  std::map<std::pair<std::string, int64_t>, double> scalars;
  for (const auto& s : tb["scalars"]) {
    const auto key = std::make_pair(s[0].get<std::string>(), s[1].get<int64_t>());
    EXPECT_EQ(scalars.count(key), 0u) << "scalar " << key.first << " at step " << key.second << " written twice";
    scalars[key] = s[2].get<double>();
  }
  size_t numbers = 0;
  for (const json& r : read_jsonl(run + "/metrics.jsonl")) {
    const std::string type = r["type"];
    const int64_t step = r["step"];
    // Numbers, and the numbers of one nested object ("breakdown": {"forward": …} → breakdown/forward).
    std::vector<std::pair<std::string, double>> flat;
    for (const auto& [k, v] : r.items()) {
      if (k == "type" || k == "step") continue;
      if (v.is_number()) flat.emplace_back(k, v.get<double>());
      if (!v.is_object()) continue;
      for (const auto& [sub, x] : v.items()) {
        if (x.is_number()) flat.emplace_back(k + "/" + sub, x.get<double>());
      }
    }
    for (const auto& [k, v] : flat) {
      ++numbers;
      const auto it = scalars.find({type + "/" + k, step});
      ASSERT_NE(it, scalars.end()) << type << "/" << k << " at step " << step << " is not in TensorBoard";
      EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(v))) << it->first.first << " @ " << step;
    }
  }
  EXPECT_EQ(scalars.size(), numbers) << "TensorBoard holds scalars that metrics.jsonl does not";

  // The config of each session (a resumed one may change cosmetic keys), the newest as
  // config.toml holds it.
  ASSERT_EQ(tb["texts"].size(), sessions);
  for (const auto& t : tb["texts"]) {
    EXPECT_EQ(t[0], "config");
    EXPECT_EQ(t[3], "text");
  }
  EXPECT_EQ(tb["texts"].back()[2], "```toml\n" + test::read_text(run + "/config.toml") + "```\n");

  // HParams: each session's experiment and start, one end at the last step; the values are the
  // config's, without run.* and cosmetic keys.
  std::vector<std::pair<std::string, int64_t>> hp;
  json values;
  for (const auto& h : tb["hparams"]) {
    hp.emplace_back(h[0].get<std::string>(), h[1].get<int64_t>());
    if (h[0] == "_hparams_/session_start_info") values = h[2]["values"];
    if (h[0] == "_hparams_/experiment") {
      EXPECT_EQ(h[2]["metrics"], json::parse(R"([["", "eval/test_acc", 2], ["", "eval/test_top5", 2],
                                                ["", "eval/test_loss", 2]])"));
    }
  }
  ASSERT_EQ(hp.size(), 2 * sessions + 1);
  EXPECT_EQ(hp.back(), std::make_pair(std::string("_hparams_/session_end_info"), last_step));
  EXPECT_EQ(values["optim.lr"], 0.002);
  EXPECT_EQ(values["model.name"], "fmnist_cnn");
  EXPECT_EQ(values["train.batch_size"], 128.0);
  EXPECT_EQ(values["train.channels_last"], true);
  EXPECT_EQ(values["loss.name"], "cross_entropy");
  EXPECT_FALSE(values.contains("run.dir"));
  EXPECT_FALSE(values.contains("train.max_steps")) << "cosmetic keys are not hyperparameters";

  // Histograms: every parameter's weight and gradient at steps 10, 20, … once each, counting
  // every element.
  const auto sizes = parameter_sizes(run);
  ASSERT_FALSE(sizes.empty());
  std::map<std::pair<std::string, int64_t>, int> seen;
  for (const auto& h : tb["histograms"]) {
    const std::string tag = h[0];
    const int64_t step = h[1];
    ++seen[{tag, step}];
    const std::string name = tag.substr(tag.find('/') + 1);
    ASSERT_EQ(sizes.count(name), 1u) << tag;
    EXPECT_EQ(h[4].get<double>(), static_cast<double>(sizes.at(name))) << tag << " num";
    double counted = 0;
    for (const auto& c : h[8]) counted += c.get<double>();
    EXPECT_EQ(counted, h[4].get<double>()) << tag << " buckets";
    EXPECT_LE(h[2].get<double>(), h[3].get<double>()) << tag;
    EXPECT_EQ(h[7].back().get<double>(), h[3].get<double>()) << tag << ": the last bucket ends at the max";
  }
  for (int64_t step = 10; step <= last_step; step += 10) {
    for (const auto& [name, n] : sizes) {
      EXPECT_EQ((seen[{"weight/" + name, step}]), 1) << name << " weights at step " << step;
      EXPECT_EQ((seen[{"grad/" + name, step}]), 1) << name << " gradients at step " << step;
    }
  }
  EXPECT_EQ(seen.size(), 2 * sizes.size() * static_cast<size_t>(last_step / 10));
}

TEST(TensorBoardCli, ScalarsEqualMetricsAndAResumeDoesNotDoubleThem) {
  test::TempDir d;
  const std::string run = d / "tb";
  auto r = test::run_command(tb_run(d, 30));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_tb_matches_run(run, 30, 1);

  // A crash after step 30's events but before its checkpoint: drop that checkpoint, so the run
  // resumes at 20 and writes 21–30 again (and goes on to 40).
  for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
    if (e.path().filename().string().rfind("ckpt-000000030", 0) == 0) fs::remove(e.path());
  }
  r = test::run_command(tb_run(d, 40));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_contains(r.err + r.out, "resumed from");
  expect_tb_matches_run(run, 40, 2);

  // --restart starts TensorBoard afresh with the run; log.tensorboard = false writes none.
  r = test::run_command(with_args(tb_run(d, 10), {"--restart"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_tb_matches_run(run, 10, 1);
  r = test::run_command(with_args(tb_run(d, 10, {"--set", "log.tensorboard=false"}), {"--restart"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(run + "/tb"));
}

}  // namespace
}  // namespace crucible
