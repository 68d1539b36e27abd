// TorchScript user models (model.name = "torchscript"): a scripted Python module trains through
// the Model interface (named tensors, mode, channels_last), is written back loadable by
// torch.jit.load with the same outputs, and a traced module whose mode is frozen is refused.
// Python (Debian's torch 1.13) makes the modules. To add a case: save another module in
// make_modules() and load it with load().
#include "crucible/nn/torchscript.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/nn/model.h"
#include "test_util.h"

namespace crucible::nn {
namespace {

// A module with conv, BatchNorm, dropout, a loop and a branch on the batch size.
const char* kNet = R"(import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    def __init__(self, dropout=0.3, bn=True):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
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

void make_modules(const test::TempDir& d) {
  test::run_python(std::string(kNet) + "import numpy as np\n"
                   "d = '" + d.path() + "/'\n"
                   "torch.manual_seed(0)\n"
                   "m = Net()\n"
                   "torch.jit.save(torch.jit.script(m), d + 'scripted.pt')\n"
                   "x = torch.randn(4, 2, 8, 8)\n"
                   "np.save(d + 'x.npy', x.numpy())\n"
                   "torch.jit.save(torch.jit.trace(Net(dropout=0.3, bn=False), x, check_trace=False), d + 'traced_dropout.pt')\n"
                   "torch.jit.save(torch.jit.trace(Net(dropout=0, bn=True), x, check_trace=False), d + 'traced_bn.pt')\n"
                   "torch.jit.save(torch.jit.trace(Net(dropout=0, bn=False), x, check_trace=False), d + 'traced_plain.pt')\n"
                   "torch.jit.save(torch.jit.freeze(torch.jit.script(Net()).eval()), d + 'frozen.pt')\n");
}

std::unique_ptr<Model> load(const std::string& path) {
  ModelOptions o;
  o.name = "torchscript";
  o.path = path;
  return make_model(o, 2, 8, 8, 4);
}

TEST(TorchScript, ScriptedModuleTrainsKeepsBuffersAndSwitchesMode) {
  test::TempDir d;
  make_modules(d);
  auto m = load(d / "scripted.pt");
  std::vector<std::string> names, buffers;
  for (const auto& p : m->named_parameters()) names.push_back(p.name);
  for (const auto& b : m->named_buffers()) buffers.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "conv2.bias",
                                             "fc.weight", "fc.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"}));
  EXPECT_EQ(parameter_count(*m), 2 * 8 * 9 + 16 + 8 * 8 * 9 + 8 + 8 * 4 + 4);
  EXPECT_EQ(m->nn_module(), nullptr);
  // The interpreter runs one graph from the first call (no profiling re-optimisation): a resumed
  // run computes what an uninterrupted one does.
  EXPECT_FALSE(torch::jit::getGraphExecutorOptimize());

  const at::Tensor x = io::load_npy_tensor(d / "x.npy").clone();
  m->train(true);
  const at::Tensor mean0 = m->named_buffers()[0].tensor.clone();
  compat::seed_cpu_generator(1);
  at::Tensor a = m->forward(x);
  EXPECT_TRUE(a.requires_grad());
  EXPECT_FALSE(at::equal(mean0, m->named_buffers()[0].tensor));  // BN running statistics moved
  EXPECT_EQ(m->named_buffers()[2].tensor.item<int64_t>(), 1);
  a.sum().backward();
  for (const auto& p : m->named_parameters()) EXPECT_TRUE(p.tensor.grad().defined()) << p.name;
  at::Tensor b = m->forward(x);
  EXPECT_FALSE(at::equal(a, b));  // dropout on (and statistics of another step)
  {
    EvalGuard g(*m);  // M1
    EXPECT_FALSE(m->is_training());
    const at::Tensor mean1 = m->named_buffers()[0].tensor.clone();
    at::Tensor e1 = m->forward(x), e2 = m->forward(x);
    EXPECT_FALSE(e1.requires_grad());
    EXPECT_TRUE(at::equal(e1, e2));                                  // dropout off
    EXPECT_TRUE(at::equal(mean1, m->named_buffers()[0].tensor));     // statistics kept
  }
  EXPECT_TRUE(m->is_training());

  // channels_last on the script module's own parameters: same outputs in eval mode.
  m->train(false);
  at::NoGradGuard no_grad;
  const at::Tensor before = m->forward(x);
  to_channels_last(*m);
  EXPECT_TRUE(m->named_parameters()[0].tensor.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_LT((m->forward(x) - before).abs().max().item<float>(), 1e-5);

  // Written back: Python's torch.jit.load gives what crucible's forward gives (eval mode).
  ASSERT_EQ(m->save_program(d.path(), "out"), d / "out.ts.pt");
  const at::Tensor mine = m->forward(x);
  const auto theirs = nlohmann::json::parse(test::run_python(
      "import json, numpy as np, torch\n"
      "m = torch.jit.load('" + d / "out.ts.pt" + "')\n"
      "assert not m.training\n"
      "print(json.dumps(m(torch.from_numpy(np.load('" + d / "x.npy" + "'))).tolist()))\n"));
  ASSERT_EQ(theirs.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_NEAR(theirs[i][j].get<double>(), mine[i][j].item<double>(), 1e-5) << i << "," << j;
    }
  }
}

TEST(TorchScript, TracedModuleWithFrozenModeIsRefused) {
  test::TempDir d;
  make_modules(d);
  test::expect_bad_input([&] { load(d / "traced_dropout.pt"); },
                         {"traced_dropout.pt", "aten::dropout", "torch.jit.script", "train() and eval()"});
  test::expect_bad_input([&] { load(d / "traced_bn.pt"); }, {"aten::batch_norm", "torch.jit.script"});
  // No mode-dependent op: a traced module behaves alike in both modes, so it may train.
  EXPECT_NO_THROW(load(d / "traced_plain.pt"));
  test::expect_bad_input([&] { load(d / "frozen.pt"); }, {"frozen.pt"});
  test::expect_bad_input([&] { load(d / "missing.pt"); }, {"missing.pt", "torch.jit.script"});
  ModelOptions o;
  o.name = "torchscript";
  test::expect_bad_input([&] { make_model(o, 2, 8, 8, 4); }, {"model.path"});
  o.path = d / "scripted.pt";
  test::expect_bad_input([&] { make_model(o, 2, 8, 8, 10); }, {"[2, 4]", "10 classes"});
}

}  // namespace
}  // namespace crucible::nn
