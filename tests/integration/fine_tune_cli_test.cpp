// Fine-tuning (model.init / init_ignore / freeze) end to end, from weights that Debian's
// torchvision saved with torch.save: a ResNet-18 whose head has another class count trains on
// Fashion-MNIST, the frozen layers come out bit-equal to the file and the others moved; a
// DDP-style "module." file (X4) loads to the same weights; a missing key exits 2 naming it,
// and init_ignore lets it through.
// To add a case: write weights with test::run_python, run fine_tune_run() with extra --set
// options, and assert on the exit code, stderr or the checkpoint (read with Python).
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;

// 4 fp32 steps of ResNet-18 on 512 Fashion-MNIST images (1 channel: conv1 is ignored).
std::vector<std::string> fine_tune_run(const test::TempDir& dir, const std::string& name,
                                       std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), "train",
                                  "--set", "run.dir=" + dir.path(),
                                  "--set", "run.name=" + name,
                                  "--set", "model.name=resnet18",
                                  "--set", "data.train_samples=512",
                                  "--set", "data.test_samples=128",
                                  "--set", "train.epochs=1",
                                  "--set", "train.max_steps=4",
                                  "--set", "train.batch_size=64",
                                  "--set", "train.eval_batch_size=128",
                                  "--set", "train.precision=fp32",
                                  "--set", "train.channels_last=false",
                                  "--set", "log.every_steps=2"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

// torchvision's resnet18 with a 7-class head, seeded, saved plainly and DDP-style ("module.").
void write_torchvision_weights(const test::TempDir& d) {
  test::run_python("import torch, torchvision\n"
                   "torch.manual_seed(3)\n"
                   "m = torchvision.models.resnet18(num_classes=7)\n"
                   "sd = m.state_dict()\n"
                   "torch.save(sd, '" + d.path() + "/tv.pt')\n"
                   "torch.save({'module.' + k: v for k, v in sd.items()}, '" + d.path() + "/ddp.pt')\n"
                   "cut = dict(sd); del cut['layer4.1.bn2.running_var']\n"
                   "torch.save(cut, '" + d.path() + "/cut.pt')\n");
}

TEST(FineTuneCli, TorchvisionWeightsWithAnotherHeadTrainAndFrozenLayersStayFixed) {
  test::TempDir d;
  write_torchvision_weights(d);
  auto r = test::run_command(fine_tune_run(d, "ft", {"--set", "model.init=" + d.path() + "/tv.pt",
                                                     "--set", "model.init_ignore=[\"conv1.weight\"]",
                                                     "--set", "model.freeze=[\"bn1.*\", \"layer1.*\"]"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out + r.err, "classifier head fc.weight ([7, 512] in the file, [10, 512] here) re-initialised");
  expect_contains(r.out + r.err, "not loaded (model.init_ignore): conv1.weight");
  expect_contains(r.out + r.err, "model.freeze: 14 parameter tensor(s) kept fixed");
  // The trained weights against the file: frozen ones equal bit for bit, trained ones moved,
  // the head is 10 classes.
  const std::string out = test::run_python(
      "import glob, json, struct, numpy as np, torch\n"
      "sd = torch.load('" + d.path() + "/tv.pt')\n"
      "path = sorted(glob.glob('" + d.path() + "/ft/checkpoints/*.safetensors'))[-1]\n"
      "b = open(path, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])\n"
      "def t(k):\n"
      "    e = h['model.' + k]; s, f = e['data_offsets']\n"
      "    return np.frombuffer(b[8 + n + s:8 + n + f], np.float32).reshape(e['shape'])\n"
      "res = {}\n"
      "for k in ['bn1.weight', 'layer1.0.conv1.weight', 'layer1.1.bn2.bias']:\n"
      "    res[k] = bool(np.array_equal(t(k), sd[k].numpy()))\n"
      "for k in ['layer2.0.conv1.weight', 'layer4.1.bn2.weight']:\n"
      "    res[k] = bool(np.array_equal(t(k), sd[k].numpy()))\n"
      "res['fc'] = list(t('fc.weight').shape)\n"
      "print(json.dumps(res))\n");
  const json j = json::parse(out);
  EXPECT_TRUE(j["bn1.weight"].get<bool>()) << out;
  EXPECT_TRUE(j["layer1.0.conv1.weight"].get<bool>()) << out;
  EXPECT_TRUE(j["layer1.1.bn2.bias"].get<bool>()) << out;
  EXPECT_FALSE(j["layer2.0.conv1.weight"].get<bool>()) << out;  // trained
  EXPECT_FALSE(j["layer4.1.bn2.weight"].get<bool>()) << out;
  EXPECT_EQ(j["fc"], json::array({10, 512}));
  const json s = json::parse(test::read_text(d / "ft/summary.json"));
  EXPECT_EQ(s["steps"].get<int64_t>(), 4);
}

// X4: the DDP-saved file ("module." on every name) gives the very same start, so the same
// trained weights; the log says what was stripped.
TEST(FineTuneCli, ModulePrefixedWeightsLoadTheSameX4) {
  test::TempDir d;
  write_torchvision_weights(d);
  std::vector<std::string> shas;
  for (const char* f : {"tv.pt", "ddp.pt"}) {
    const std::string run = std::string("from_") + f;
    auto r = test::run_command(fine_tune_run(d, run, {"--set", std::string("model.init=") + d.path() + "/" + f,
                                                    "--set", "model.init_ignore=[\"conv1.weight\"]",
                                                    "--set", "train.max_steps=1"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (std::string(f) == "ddp.pt") expect_contains(r.out + r.err, "module.");
    shas.push_back(json::parse(test::read_text(d / (run + "/summary.json")))["params_sha256"]);
  }
  EXPECT_EQ(shas[0], shas[1]);
}

// A key missing from the file stops the run before training (exit 2), naming it and the way
// out; listing it in model.init_ignore lets the run start. An unknown freeze pattern is exit 2.
TEST(FineTuneCli, MissingKeysExitTwoNamingThemUnlessIgnored) {
  test::TempDir d;
  write_torchvision_weights(d);
  auto r = test::run_command(fine_tune_run(d, "cut", {"--set", "model.init=" + d.path() + "/cut.pt",
                                                      "--set", "model.init_ignore=[\"conv1.weight\"]"}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_contains(r.err, "missing from the file (1): layer4.1.bn2.running_var");
  expect_contains(r.err, "model.init_ignore");
  EXPECT_FALSE(std::filesystem::exists(d / "cut/summary.json"));

  r = test::run_command(fine_tune_run(d, "cut2", {"--set", "model.init=" + d.path() + "/cut.pt",
                                                  "--set", "model.init_ignore=[\"conv1.weight\", \"layer4.1.bn2.*\"]",
                                                  "--set", "train.max_steps=1"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;

  r = test::run_command(fine_tune_run(d, "nofc", {"--set", "model.init=" + d.path() + "/tv.pt",
                                                  "--set", "model.init_ignore=[\"conv1.weight\"]",
                                                  "--set", "model.freeze=[\"layer9.*\"]"}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_contains(r.err, "model.freeze: pattern \"layer9.*\" matches no parameter");
}

}  // namespace
}  // namespace crucible
