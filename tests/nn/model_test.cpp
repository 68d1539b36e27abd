// M1: evaluation runs in eval mode without gradients and restores the previous mode; the
// reference model's parameter names match the PyTorch baseline's; params_sha256 depends on
// values, not memory format.
#include "crucible/nn/model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/train/trainer.h"

namespace crucible::nn {
namespace {

TEST(EvalGuard, EvalModeNoGradAndRestoreM1) {
  compat::seed_cpu_generator(1);
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  m->module().train();
  at::Tensor x = at::randn({4, 1, 28, 28});
  {
    EvalGuard g(m->module());
    EXPECT_FALSE(m->module().is_training());
    at::Tensor a = m->forward(x), b = m->forward(x);
    EXPECT_FALSE(a.requires_grad());
    EXPECT_TRUE(at::equal(a, b));  // dropout off, BN running stats
  }
  EXPECT_TRUE(m->module().is_training());
  at::Tensor t1 = m->forward(x);
  EXPECT_TRUE(t1.requires_grad());
  m->module().eval();
  { EvalGuard g(m->module()); }
  EXPECT_FALSE(m->module().is_training());  // restores what it found
}

TEST(Model, ParameterNamesMatchTheBaseline) {
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  std::vector<std::string> names;
  for (const auto& p : m->module().named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight",
                                             "bn2.bias", "conv3.weight", "bn3.weight", "bn3.bias", "conv4.weight",
                                             "bn4.weight", "bn4.bias", "fc1.weight", "fc1.bias", "fc2.weight",
                                             "fc2.bias"}));
  EXPECT_EQ(parameter_count(*m), 870826);
}

TEST(Model, RejectsInputItCannotTake) {
  EXPECT_THROW(make_model(ModelOptions{}, 1, 30, 30, 10), Error);
  ModelOptions o;
  o.name = "resnet9000";
  EXPECT_THROW(make_model(o, 1, 28, 28, 10), Error);
}

TEST(ParamsSha256, ValuesNotMemoryFormat) {
  compat::seed_cpu_generator(3);
  auto a = make_model(ModelOptions{}, 1, 28, 28, 10);
  compat::seed_cpu_generator(3);
  auto b = make_model(ModelOptions{}, 1, 28, 28, 10);
  for (auto& p : b->module().parameters()) {
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
  EXPECT_EQ(train::params_sha256(a->module()), train::params_sha256(b->module()));
  {
    at::NoGradGuard g;
    b->module().parameters()[0].view(-1)[0].add_(1e-6);
  }
  EXPECT_NE(train::params_sha256(a->module()), train::params_sha256(b->module()));
}

}  // namespace
}  // namespace crucible::nn
