// M7: a bias feeding a BatchNorm is named at start-up; the reference model has none.
#include "crucible/nn/lint.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "crucible/nn/model.h"

namespace crucible::nn {
namespace {

struct Block : torch::nn::Module {
  Block() {
    register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));  // bias on
    register_module("bn", torch::nn::BatchNorm2d(8));
    register_module("head", torch::nn::Linear(8, 4));  // bias, but no norm after it
  }
};

struct Net : torch::nn::Module {
  Net() {
    register_module("block", std::make_shared<Block>());
    register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(false)));
    register_module("bn", torch::nn::BatchNorm1d(4));
  }
};

TEST(Lint, BiasBeforeBatchNormIsNamedM7) {
  Net net;
  const auto found = lint_bias_before_norm(net);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find("block.conv (Conv2d with bias) feeds block.bn"), std::string::npos) << found[0];
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  EXPECT_TRUE(lint_bias_before_norm((*m->nn_module())).empty());
}

}  // namespace
}  // namespace crucible::nn
