// Exported programs (model.name = "exported") against eager PyTorch on torchvision's models:
// resnet18 and a small VisionTransformer, exported by crucible.export, run by crucible's graph
// runner. Forward equals eager in eval and in train mode (BatchNorm's updated buffers included)
// to 1e-5, and 10 SGD steps equal eager's to 1e-4. torch.export needs torch 2.x: this runs in
// the build against the venv's torch (make test-torch2) and is skipped in Debian's 1.13 build.
// To add a model: one more entry in kModels (its Python constructor and input shape).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include "crucible/core/compat.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/exported.h"
#include "test_util.h"

namespace crucible::nn {
namespace {

#ifdef CRUCIBLE_TEST_TORCH2_PYTHON
struct ExportCase {
  const char* name;
  const char* make;  // Python expression building the model
};

const ExportCase kModels[] = {
    {"resnet18", "torchvision.models.resnet18(num_classes=4)"},
    {"vit", "torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, "
            "hidden_dim=32, mlp_dim=64, num_classes=4)"},
};

constexpr int kSteps = 10;
constexpr int kBatch = 16;

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}
#endif

TEST(ExportedModel, TorchvisionModelsEqualEagerInBothModesAndInTraining) {
#ifndef CRUCIBLE_TEST_TORCH2_PYTHON
  GTEST_SKIP() << "torch.export needs torch 2.x: make test-torch2 runs this";
#else
  for (const ExportCase& c : kModels) {
    SCOPED_TRACE(c.name);
    test::TempDir d;
    const std::string script = fmt::format(
        "import numpy as np, torch, torchvision, crucible, torch.nn.functional as F\n"
        "d = '{}/'\n"
        "torch.manual_seed(1)\n"
        "m = {}\n"
        "with torch.no_grad():  # torchvision's ViT starts with a zero head: outputs would be 0 in every mode\n"
        "    for p in m.parameters():\n"
        "        if p.dim() > 1 and not p.any(): p.normal_(0, 0.1)\n"
        "x = torch.randn(64, 3, 32, 32); y = torch.randint(0, 4, (64,))\n"
        "np.save(d + 'x.npy', x.numpy()); np.save(d + 'y.npy', y.numpy())\n"
        "crucible.export(m, torch.zeros(4, 3, 32, 32), d + 'm.pt2')\n"
        "start = {{k: v.clone() for k, v in m.state_dict().items()}}\n"
        "# eager nn.MultiheadAttention takes a fused fast path in eval mode that export does not record:\n"
        "# compare with the path the program holds\n"
        "torch.backends.mha.set_fastpath_enabled(False)\n"
        "with torch.no_grad():\n"
        "    np.save(d + 'eval.npy', m.eval()(x[:8]).numpy())\n"
        "    np.save(d + 'train.npy', m.train()(x[:8]).numpy())\n"
        "for k, v in m.state_dict().items(): np.save(d + 'after_train_forward.' + k + '.npy', v.numpy())\n"
        "m.load_state_dict(start)\n"
        "with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    cl = m.to(memory_format=torch.channels_last).eval()\n"
        "    np.save(d + 'bf16_cl.npy', cl(x[:8].contiguous(memory_format=torch.channels_last)).float().numpy())\n"
        "m = m.to(memory_format=torch.contiguous_format).train()\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for s in range({}):\n"
        "    i = slice((s % 4) * {}, (s % 4 + 1) * {})\n"
        "    opt.zero_grad(); F.cross_entropy(m(x[i]), y[i]).backward(); opt.step()\n"
        "for k, v in m.state_dict().items(): np.save(d + 'trained.' + k + '.npy', v.numpy())\n",
        d.path(), c.make, kSteps, kBatch, kBatch);
    test::write_text(d / "make.py", script);
    const auto r = test::run_command({"/usr/bin/env", "PYTHONPATH=" CRUCIBLE_TEST_PYTHONPATH,
                                      CRUCIBLE_TEST_TORCH2_PYTHON, d / "make.py"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const at::Tensor x = io::load_npy_tensor(d / "x.npy"), y = io::load_npy_tensor(d / "y.npy");

    ModelOptions options;
    options.name = "exported";
    options.path = d / "m.pt2";
    auto fresh = [&] { return make_exported({options, 3, 32, 32, 4}); };
    {
      auto m = fresh();
      at::NoGradGuard no_grad;
      m->train(false);
      const double eval_diff = max_diff(m->forward(x.slice(0, 0, 8)), io::load_npy_tensor(d / "eval.npy"));
      m->train(true);
      const double train_diff = max_diff(m->forward(x.slice(0, 0, 8)), io::load_npy_tensor(d / "train.npy"));
      double buffers = 0;
      for (const auto& b : m->named_buffers()) {
        buffers = std::max(buffers, max_diff(b.tensor, io::load_npy_tensor(d / ("after_train_forward." + b.name + ".npy"))));
      }
      std::printf("%s: forward differs from eager by %.3g (eval) and %.3g (train; buffers %.3g)\n", c.name, eval_diff,
                  train_diff, buffers);
      EXPECT_GT(io::load_npy_tensor(d / "eval.npy").abs().max().item<double>(), 1e-2);  // outputs, not zeros
      EXPECT_LT(eval_diff, 1e-5);
      EXPECT_LT(train_diff, 1e-5);
      EXPECT_LT(buffers, 1e-5);
    }
    {
      // bf16 autocast and channels_last, as the trainer applies them to any model.
      auto m = fresh();
      to_channels_last(*m);
      m->train(false);
      at::NoGradGuard no_grad;
      compat::AutocastGuard autocast(c10::kCPU, c10::ScalarType::BFloat16, true);
      const at::Tensor out = m->forward(x.slice(0, 0, 8).contiguous(at::MemoryFormat::ChannelsLast)).to(at::kFloat);
      const double diff = max_diff(out, io::load_npy_tensor(d / "bf16_cl.npy"));
      std::printf("%s: bf16 autocast + channels_last forward differs from eager's by %.3g\n", c.name, diff);
      EXPECT_LT(diff, 1e-5);
    }
    auto m = fresh();
    m->train(true);
    auto params = m->named_parameters();
    for (int s = 0; s < kSteps; ++s) {
      const int64_t first = (s % 4) * kBatch;
      const at::Tensor loss = at::cross_entropy_loss(m->forward(x.slice(0, first, first + kBatch)),
                                                     y.slice(0, first, first + kBatch));
      loss.backward();
      at::NoGradGuard no_grad;
      for (auto& p : params) {
        p.tensor.sub_(p.tensor.grad(), 0.01);
        p.tensor.mutable_grad() = at::Tensor();
      }
    }
    double trained = 0, moved = 0;
    std::vector<NamedTensor> all = m->named_parameters();
    for (auto& b : m->named_buffers()) all.push_back(b);
    for (const auto& t : all) {
      const at::Tensor want = io::load_npy_tensor(d / ("trained." + t.name + ".npy"));
      trained = std::max(trained, max_diff(t.tensor.detach(), want));
      if (t.tensor.is_floating_point()) {
        moved = std::max(moved, max_diff(want, io::load_npy_tensor(d / ("after_train_forward." + t.name + ".npy"))));
      }
    }
    std::printf("%s: %d SGD steps, weights differ from eager's by %.3g (moved by up to %.3g)\n", c.name, kSteps,
                trained, moved);
    EXPECT_LT(trained, 1e-4);
    EXPECT_GT(moved, 1e-3);
  }
#endif
}

}  // namespace
}  // namespace crucible::nn
