// `crucible train` with model.name = "torchscript": a Python model (conv, BatchNorm, dropout, a
// loop and a branch), scripted and saved, trains to the weights a plain PyTorch loop reaches on
// the same batches (the oracle), resumes bit for bit, is written back as TorchScript and
// safetensors, and a traced module with a frozen mode exits 2.
// To add a case: write a module with test::run_python (kNet), run ts_run() with extra --set
// options, and assert on the exit code, the log or the run folder.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;

const char* kNet = R"(import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8, 4)
    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for _ in range(2):
            x = x + F.relu(self.conv2(x))
        if x.shape[0] > 1:
            x = x - 0.1 * x.mean(0, keepdim=True)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.drop(x))
)";

constexpr int kSteps = 50;  // 512 samples / batch 32 = 16 steps per epoch: 3 epoch ends, then mid-epoch

void write_data(const test::TempDir& d) {
  test::run_python(std::string(kNet) + "import numpy as np\n"
                   "d = '" + d.path() + "/'\n"
                   "rng = np.random.default_rng(0)\n"
                   "for split, n in (('train', 512), ('test', 64)):\n"
                   "    np.save(d + split + '_x.npy', rng.standard_normal((n, 2, 8, 8)).astype(np.float32))\n"
                   "    np.save(d + split + '_y.npy', rng.integers(0, 4, n).astype(np.int64))\n"
                   "torch.manual_seed(0)\n"
                   "m = Net()\n"
                   "torch.jit.save(torch.jit.script(m), d + 'net.pt')\n"
                   "torch.jit.save(torch.jit.trace(m, torch.zeros(4, 2, 8, 8)), d + 'traced.pt')\n");
}

std::vector<std::string> ts_run(const test::TempDir& d, const std::string& name, const std::string& module,
                                std::initializer_list<std::string> extra = {}) {
  std::vector<std::string> cmd = {test::crucible_binary(), "train",
                                  "--set", "run.dir=" + d.path(),
                                  "--set", "run.name=" + name,
                                  "--set", "model.name=torchscript",
                                  "--set", "model.path=" + (d / module),
                                  "--set", "data.dataset=arrays",
                                  "--set", "data.train_images=" + (d / "train_x.npy"),
                                  "--set", "data.train_labels=" + (d / "train_y.npy"),
                                  "--set", "data.test_images=" + (d / "test_x.npy"),
                                  "--set", "data.test_labels=" + (d / "test_y.npy"),
                                  "--set", "data.threads=1",
                                  "--set", "train.epochs=4",
                                  "--set", "train.max_steps=" + std::to_string(kSteps),
                                  "--set", "train.batch_size=32",
                                  "--set", "train.eval_batch_size=32",
                                  "--set", "train.precision=fp32",
                                  "--set", "train.channels_last=false",
                                  "--set", "train.threads=1",
                                  "--set", "optim.name=adamw",
                                  "--set", "optim.lr=0.003",
                                  "--set", "optim.weight_decay=0.01",
                                  "--set", "optim.decay_bias_and_norm=true",
                                  "--set", "schedule.name=constant",
                                  "--set", "loss.label_smoothing=0",
                                  "--set", "checkpoint.every_steps=10",
                                  "--set", "checkpoint.keep=20",
                                  "--set", "log.every_steps=10"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::string stream_seed(const std::string& log, const std::string& stream) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(stream + " ([0-9]+)"))) return "";
  return m[1];
}

TEST(TorchScriptCli, TrainsLikeAPlainPytorchLoopAndWritesTheModuleBack) {
  test::TempDir d;
  write_data(d);
  auto r = test::run_command(ts_run(d, "ts", "net.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string sampler = stream_seed(r.out + r.err, "sampler"), dropout = stream_seed(r.out + r.err, "dropout");
  ASSERT_FALSE(sampler.empty());
  ASSERT_FALSE(dropout.empty());
  ASSERT_TRUE(fs::exists(d / "ts/model.ts.pt"));
  ASSERT_TRUE(fs::exists(d / "ts/model.safetensors"));

  // The oracle: the same module in eager PyTorch, the same batches (DistributedSampler's order
  // for seed + epoch, one replica), the same dropout stream, AdamW (all tensors decayed).
  const std::string out = test::run_python(
      std::string(kNet) + "import json, numpy as np\n" + test::python_read_safetensors(d / "ts/model.safetensors") +
      "d = '" + d.path() + "/'\n"
      "torch.set_num_threads(1)\n"
      "x = torch.from_numpy(np.load(d + 'train_x.npy')); y = torch.from_numpy(np.load(d + 'train_y.npy'))\n"
      "m = Net(); m.load_state_dict(torch.jit.load(d + 'net.pt').state_dict())\n"
      "opt = torch.optim.AdamW(m.parameters(), lr=0.003, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)\n"
      "torch.manual_seed(" + dropout + ")\n"
      "m.train(); step = 0; epoch = 0\n"
      "while step < " + std::to_string(kSteps) + ":\n"
      "    g = torch.Generator(); g.manual_seed((" + sampler + " + epoch) % 2**32)\n"
      "    order = torch.randperm(len(x), generator=g)\n"
      "    for first in range(0, len(x), 32):\n"
      "        if step == " + std::to_string(kSteps) + ": break\n"
      "        i = order[first:first + 32]\n"
      "        opt.zero_grad(set_to_none=True)\n"
      "        F.cross_entropy(m(x[i]), y[i]).backward()\n"
      "        opt.step(); step += 1\n"
      "    epoch += 1\n"
      "mine = {k: v.detach() for k, v in m.state_dict().items()}\n"
      "ts = torch.jit.load(d + 'ts/model.ts.pt').state_dict()\n"
      "dt = {'F32': np.float32, 'I64': np.int64}\n"
      "st = {k: torch.from_numpy(np.frombuffer(b[8 + n + e['data_offsets'][0]:8 + n + e['data_offsets'][1]], "
      "dt[e['dtype']]).reshape(e['shape']).copy()) for k, e in h.items() if k != '__metadata__'}\n"
      "assert sorted(ts) == sorted(mine) == sorted(st), (sorted(ts), sorted(st))\n"
      "diff = max((mine[k].double() - ts[k].double()).abs().max().item() for k in mine)\n"
      "same = all(torch.equal(ts[k], st[k]) for k in ts)\n"
      "moved = max((mine[k].double() - torch.jit.load(d + 'net.pt').state_dict()[k].double()).abs().max().item() "
      "for k in mine if mine[k].is_floating_point())\n"
      "print(json.dumps({'diff': diff, 'same': same, 'moved': moved, 'tracked': int(ts['bn1.num_batches_tracked'])}))\n");
  const json j = json::parse(out);
  std::printf("oracle: max abs difference %.3g over parameters and buffers (weights moved by up to %.3g)\n",
              j["diff"].get<double>(), j["moved"].get<double>());
  EXPECT_LT(j["diff"].get<double>(), 1e-4);
  EXPECT_GT(j["moved"].get<double>(), 1e-2);  // it trained
  EXPECT_TRUE(j["same"].get<bool>());         // safetensors holds what the TorchScript file holds
  EXPECT_EQ(j["tracked"].get<int64_t>(), kSteps);  // BatchNorm buffers updated in train mode only

  // predict from the module written back, with no run behind it (model.name = "torchscript"
  // and its model.path are the model source), writes the very file predict writes from the
  // run's checkpoint: the same weights, in eval mode, on the same test data.
  auto predict = [&](const std::string& name, const std::string& module, const std::string& out) {
    std::vector<std::string> cmd = ts_run(d, name, module);
    cmd[1] = "predict";
    cmd.insert(cmd.end(), {"--top", "3", "--out", d / out});
    return test::run_command(cmd);
  };
  auto from_ckpt = predict("ts", "net.pt", "ckpt.jsonl");
  ASSERT_EQ(from_ckpt.exit_code, 0) << from_ckpt.out << from_ckpt.err;
  auto from_module = predict("nothing-trained", "ts/model.ts.pt", "module.jsonl");
  ASSERT_EQ(from_module.exit_code, 0) << from_module.out << from_module.err;
  expect_contains(from_module.out + from_module.err, {"TorchScript module", "ts/model.ts.pt"});
  const std::string ckpt_file = test::read_text(d / "ckpt.jsonl");
  EXPECT_EQ(test::read_text(d / "module.jsonl"), ckpt_file);
  EXPECT_EQ(std::count(ckpt_file.begin(), ckpt_file.end(), '\n'), 64);
  EXPECT_FALSE(fs::exists(d / "nothing-trained"));  // predict creates no run folder
}

TEST(TorchScriptCli, ResumedRunEqualsUninterruptedOne) {
  test::TempDir d;
  write_data(d);
  auto r = test::run_command(ts_run(d, "ts", "net.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string want = json::parse(test::read_text(d / "ts/summary.json"))["params_sha256"];
  // Back to the checkpoint of step 20 (mid-epoch 2): the rerun resumes there.
  int removed = 0;
  for (const auto& e : fs::directory_iterator(d / "ts/checkpoints")) {
    const std::string f = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(f, m, std::regex("ckpt-([0-9]+)\\.safetensors")) && std::stoll(m[1]) > 20) {
      fs::remove(e.path());
      ++removed;
    }
  }
  ASSERT_GT(removed, 0);
  fs::remove(d / "ts/model.ts.pt");
  r = test::run_command(ts_run(d, "ts", "net.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_contains(r.out, "resumed from");
  const json got = json::parse(test::read_text(d / "ts/summary.json"));
  EXPECT_EQ(got["resumed_from_step"].get<int64_t>(), 20);
  EXPECT_EQ(got["params_sha256"].get<std::string>(), want);
  EXPECT_TRUE(fs::exists(d / "ts/model.ts.pt"));
}

TEST(TorchScriptCli, TracedModuleWithDropoutExitsTwo) {
  test::TempDir d;
  write_data(d);
  auto r = test::run_command(ts_run(d, "traced", "traced.pt"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  expect_contains(r.err, "traced.pt");
  expect_contains(r.err, "torch.jit.script");
}

}  // namespace
}  // namespace crucible
