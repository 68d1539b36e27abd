// M5: accumulate_gradients over k micro-batches gives the whole batch's mean-loss gradient, for
// even and uneven splits. The model is fmnist_cnn in eval mode (BatchNorm on its running
// statistics, no dropout), where samples do not interact, so the equality is exact up to
// float rounding; loss and hit sums equal the single pass's too. To add a case: another
// (batch, parts) pair in the list.
#include "crucible/train/step.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "crucible/core/compat.h"
#include "crucible/nn/model.h"
#include "crucible/nn/model_options.h"

namespace crucible::train {
namespace {

struct Grads {
  std::vector<at::Tensor> grads;
  double loss_sum = 0;
  int64_t correct = 0;
};

Grads run(nn::Model& model, const at::Tensor& x, const at::Tensor& y, int64_t parts) {
  for (auto& p : (*model.nn_module()).parameters()) p.mutable_grad().reset();
  at::Tensor loss_sum = at::zeros({}, at::kDouble), correct = at::zeros({}, at::kLong);
  MicroBatchOptions o;
  o.parts = parts;
  o.label_smoothing = 0.1;
  int64_t calls = 0, last = 0;
  o.before_backward = [&](bool is_last) {
    ++calls;
    last += is_last ? 1 : 0;
  };
  accumulate_gradients(model, x, y, o, loss_sum, correct);
  EXPECT_EQ(calls, parts);
  EXPECT_EQ(last, 1);  // only the final micro-batch is marked (gradient sync arms there)
  Grads g;
  for (auto& p : (*model.nn_module()).parameters()) g.grads.push_back(p.grad().clone());
  g.loss_sum = loss_sum.item<double>();
  g.correct = correct.item<int64_t>();
  return g;
}

TEST(Step, AccumulatedMicroBatchesGiveTheWholeBatchGradientM5) {
  compat::seed_cpu_generator(3);
  nn::ModelOptions mo;
  auto model = nn::make_model(mo, 1, 28, 28, 10);
  (*model->nn_module()).eval();  // BatchNorm on running statistics: samples independent
  for (const auto& [batch, parts] : std::vector<std::pair<int64_t, int64_t>>{{128, 4}, {130, 4}, {67, 3}}) {
    const at::Tensor x = at::randn({batch, 1, 28, 28});
    const at::Tensor y = at::randint(0, 10, {batch}, at::kLong);
    const Grads whole = run(*model, x, y, 1);
    const Grads split = run(*model, x, y, parts);
    ASSERT_EQ(whole.grads.size(), split.grads.size());
    double worst = 0;
    for (size_t i = 0; i < whole.grads.size(); ++i) {
      const double scale = whole.grads[i].abs().max().item<double>() + 1e-12;
      worst = std::max(worst, (whole.grads[i] - split.grads[i]).abs().max().item<double>() / scale);
    }
    EXPECT_LT(worst, 1e-4) << "batch " << batch << " in " << parts << " parts: gradients differ (relative " << worst
                           << ")";
    EXPECT_NEAR(split.loss_sum, whole.loss_sum, 1e-6 * std::abs(whole.loss_sum));  // float32 losses
    EXPECT_EQ(split.correct, whole.correct);
  }
}

}  // namespace
}  // namespace crucible::train
