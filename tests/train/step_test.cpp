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
#include "crucible/data/loader/loader.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/model.h"
#include "crucible/nn/model_options.h"
#include "crucible/train/grad_scaler.h"
#include "crucible/train/job_config.h"
#include "crucible/train/loss.h"
#include "crucible/train/optimizer.h"

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

// T4: "a zero gradient means no update" is false with weight decay, so the step reports each
// parameter group's update. AdamW (decoupled decay, lr 0.01, decay 0.1) on fmnist_cnn:
// - the gradients zeroed just before the update (the before_update seam): the weights group
//   moves by exactly lr × decay × ‖w‖ (Adam's term is 0 / (0 + eps)), the biases and norm
//   weights (no decay) not at all;
// - a real step: the reported norms equal ‖after − before‖ and ‖after‖ per group computed here;
// - a step that is not the interval's last reports nothing (update_norm_every = 2, step 0).
TEST(Step, EachParameterGroupsUpdateNormIsMeasuredT4) {
  compat::seed_cpu_generator(4);
  nn::ModelOptions mo;
  auto model = nn::make_model(mo, 1, 28, 28, 10);
  model->train(true);
  OptimOptions oo;
  oo.lr = 0.01;
  oo.weight_decay = 0.1;
  std::vector<NamedTensor> params = model->named_parameters();
  auto optimizer = make_optimizer(oo, parameter_groups(oo, params));
  ASSERT_EQ(optimizer->groups().size(), 2u);
  EXPECT_EQ(optimizer->groups()[0].name, "weights");
  EXPECT_EQ(optimizer->groups()[1].name, "bias_and_norm");
  LossSection ls;
  auto loss = make_loss({ls, 10, c10::Device(c10::kCPU)});
  GradScaler scaler;
  TrainStepOptions o;
  o.update_norm_every = 1;
  TrainStep step(*model, *loss, *optimizer, scaler, params, o, c10::Device(c10::kCPU));
  const at::Tensor x = at::randn({16, 1, 28, 28}), y = at::randint(0, 10, {16}, at::kLong);
  auto group_norm = [&](size_t g, const std::vector<at::Tensor>* minus) {
    double sum = 0;
    size_t k = 0;
    for (size_t i = 0; i < g; ++i) k += optimizer->groups()[i].params.size();
    for (const auto& p : optimizer->groups()[g].params) {
      const at::Tensor t = minus ? p.tensor.detach() - (*minus)[k++] : p.tensor.detach();
      sum += t.pow(2).sum().item<double>();
    }
    return std::sqrt(sum);
  };
  auto snapshot = [&] {
    std::vector<at::Tensor> s;
    for (const auto& g : optimizer->groups()) {
      for (const auto& p : g.params) s.push_back(p.tensor.detach().clone());
    }
    return s;
  };
  step.before_update = [](const std::vector<std::string>&, const std::vector<at::Tensor>& grads) {
    for (const auto& g : grads) g.zero_();
  };
  const double w0 = group_norm(0, nullptr);
  step.run(x, y, 0, oo.lr, oo.beta1, false);
  const at::Tensor zeroed = step.sums().group_norms.clone();
  EXPECT_NEAR(zeroed[0].item<double>(), oo.lr * oo.weight_decay * w0, 1e-6 * w0);
  EXPECT_GT(zeroed[0].item<double>(), 0.0);
  EXPECT_EQ(zeroed[1].item<double>(), 0.0);
  EXPECT_NEAR(zeroed[2].item<double>(), (1 - oo.lr * oo.weight_decay) * w0, 1e-5 * w0);

  step.before_update = nullptr;
  step.sums().zero();
  const std::vector<at::Tensor> before = snapshot();
  step.run(x, y, 1, oo.lr, oo.beta1, false);
  const at::Tensor real = step.sums().group_norms.clone();
  for (size_t g = 0; g < 2; ++g) {
    const double update = group_norm(g, &before), weight = group_norm(g, nullptr);
    EXPECT_GT(update, 0.0) << g;
    EXPECT_NEAR(real[static_cast<int64_t>(g)].item<double>(), update, 1e-5 * update) << "group " << g;
    EXPECT_NEAR(real[static_cast<int64_t>(2 + g)].item<double>(), weight, 1e-5 * weight) << "group " << g;
  }

  o.update_norm_every = 2;
  TrainStep every_second(*model, *loss, *optimizer, scaler, params, o, c10::Device(c10::kCPU));
  every_second.run(x, y, 0, oo.lr, oo.beta1, false);
  EXPECT_EQ(every_second.sums().group_norms.abs().sum().item<double>(), 0.0);
  every_second.run(x, y, 1, oo.lr, oo.beta1, false);
  EXPECT_GT(every_second.sums().group_norms[0].item<double>(), 0.0);
}

// A detection batch's training targets leave the crowd regions out, as torchvision's reference
// (ConvertCocoPolysToMask: iscrowd == 0 kept) does; an image whose only box is a crowd trains
// as background; an image without crowd boxes keeps every box, in order, as a view.
TEST(Step, DetectionTargetsLeaveCrowdRegionsOutOfTraining) {
  data::Batch host;
  host.detection = true;
  host.labels = {-1, -1, -1};
  host.box_offsets = {0, 3, 4, 6};
  host.box_crowd = {0, 1, 0, 1, 0, 0};
  host.box_labels = {1, 2, 3, 4, 5, 6};
  const at::Tensor boxes = at::arange(24, at::kFloat).view({6, 4});
  const at::Tensor labels = at::tensor(host.box_labels, at::kLong);
  const std::vector<nn::BoxTargets> t = detection_targets(host, boxes, labels);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(at::equal(t[0].labels, at::tensor(std::vector<int64_t>{1, 3}, at::kLong)));
  EXPECT_TRUE(at::equal(t[0].boxes, at::stack({boxes[0], boxes[2]})));
  EXPECT_EQ(t[1].boxes.sizes(), (std::vector<int64_t>{0, 4}));  // background only
  EXPECT_EQ(t[1].labels.numel(), 0);
  EXPECT_TRUE(at::equal(t[2].labels, labels.narrow(0, 4, 2)));
  EXPECT_TRUE(at::equal(t[2].boxes, boxes.narrow(0, 4, 2)));
  EXPECT_EQ(t[2].boxes.data_ptr(), boxes[4].data_ptr());  // a view: no copy for an image without crowd
  host.box_crowd.clear();  // a source without crowd flags (YOLO labels): every box trains
  const std::vector<nn::BoxTargets> all = detection_targets(host, boxes, labels);
  EXPECT_TRUE(at::equal(all[0].labels, labels.narrow(0, 0, 3)));
}

}  // namespace
}  // namespace crucible::train
