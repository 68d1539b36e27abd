// The train layer's shared pieces: CheckpointIO lists a checkpoint once, so what is written is
// what is read back (a field saved and forgotten on resume cannot happen); the registries name
// the known entries in their errors; the optimizer registry gives each optimizer its own
// momentum (tune no longer passes AdamW's beta1 to SGD).
#include "crucible/train/run_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/batchnorm.h>

#include "crucible/core/error.h"
#include "crucible/nn/model.h"
#include "crucible/train/loss.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/trainer.h"
#include "test_util.h"

namespace crucible::train {
namespace {

using test::expect_bad_input;

struct Everything {
  torch::nn::Conv2d conv{torch::nn::Conv2dOptions(2, 3, 3)};
  torch::nn::BatchNorm2d bn{3};
  at::Tensor sum = at::zeros({}, at::kDouble);
  at::Tensor extra = at::zeros({4});
  RunState st;
  int64_t counter = 0;
  std::string text;

  void fields(CheckpointIO& io) {
    io.module("model.", *conv);
    io.module("bn.", *bn);
    io.tensor("metrics.sum", sum);
    io.tensor("metrics.extra", extra, /*required=*/false);
    io.state(st);
    io.value("counter", counter);
    io.value("text", text);
    io.note("version", "v1");
  }
};

void randomise(Everything& e, int seed) {
  at::manual_seed(seed);
  at::NoGradGuard no_grad;
  for (auto& p : e.conv->parameters()) p.uniform_(-1, 1);
  e.bn->running_mean.uniform_(-1, 1);
  e.bn->num_batches_tracked.fill_(seed);
  e.sum.fill_(1.0 / 3.0 + seed);
  e.extra.uniform_();
  e.st.step = 11 + seed;
  e.st.epoch = 2;
  e.st.batch_in_epoch = 5;
  e.st.samples = 1234567;
  e.st.step_seconds = 1.0 / 7.0;
  e.st.train_seconds = 2.0 / 7.0;
  e.st.data_wait_seconds = 3e-9;
  e.st.interval_samples = 99;
  e.st.interval_seconds = 0.1;
  e.st.last_test_acc = 0.8765432109876543;
  e.st.last_test_top5 = 0.9876543210987654 - seed / 100.0;
  e.st.last_test_loss = 0.123;
  e.st.last_eval_step = 10;
  e.counter = 42 + seed;
  e.text = "seed " + std::to_string(seed);
}

void expect_same(const CheckpointData& a, const CheckpointData& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(at::equal(a.tensors[i].tensor, b.tensors[i].tensor)) << a.tensors[i].name;
  }
  EXPECT_EQ(a.meta, b.meta);
}

// Written from one object, read into another (different values everywhere), written again:
// the two checkpoints are identical, doubles to the last bit.
TEST(RunState, CheckpointReadsBackEveryFieldItWrites) {
  Everything a, b;
  randomise(a, 1);
  randomise(b, 2);
  CheckpointData first;
  {
    CheckpointIO w = CheckpointIO::writer(first);
    a.fields(w);
  }
  CheckpointIO r = CheckpointIO::reader(first, "ckpt-1.safetensors");
  b.fields(r);
  CheckpointData second;
  CheckpointIO w2 = CheckpointIO::writer(second);
  b.fields(w2);
  expect_same(first, second);
  EXPECT_EQ(b.st.last_test_acc, a.st.last_test_acc);
  EXPECT_EQ(b.st.last_test_top5, a.st.last_test_top5);
  EXPECT_EQ(b.st.step_seconds, a.st.step_seconds);
  EXPECT_EQ(b.text, "seed 1");
  EXPECT_EQ(first.meta.at("version"), "v1");
}

// A tensor missing from the file or of another shape is named with the file; an optional one
// from an older checkpoint is left as it is.
TEST(RunState, MissingOrMisshapenTensorsAreNamed) {
  Everything a;
  randomise(a, 1);
  CheckpointData data;
  CheckpointIO w = CheckpointIO::writer(data);
  a.fields(w);

  CheckpointData no_extra = data;
  no_extra.tensors.erase(std::remove_if(no_extra.tensors.begin(), no_extra.tensors.end(),
                                        [](const NamedTensor& t) { return t.name == "metrics.extra"; }),
                         no_extra.tensors.end());
  Everything b;
  randomise(b, 3);
  const at::Tensor before = b.extra.clone();
  CheckpointIO r = CheckpointIO::reader(no_extra, "old.safetensors");
  b.fields(r);
  EXPECT_TRUE(at::equal(b.extra, before));

  // A checkpoint from before top-5 was recorded (X5) reads as "no top-5 yet".
  CheckpointData no_top5 = data;
  ASSERT_EQ(no_top5.meta.erase("last_test_top5"), 1u);
  Everything c;
  CheckpointIO r1 = CheckpointIO::reader(no_top5, "old.safetensors");
  c.fields(r1);
  EXPECT_EQ(c.st.last_test_top5, -1);
  EXPECT_EQ(c.st.last_test_acc, a.st.last_test_acc);

  CheckpointData no_sum = data;
  no_sum.tensors.erase(std::remove_if(no_sum.tensors.begin(), no_sum.tensors.end(),
                                      [](const NamedTensor& t) { return t.name == "metrics.sum"; }),
                       no_sum.tensors.end());
  expect_bad_input([&] {
    CheckpointIO r2 = CheckpointIO::reader(no_sum, "cut.safetensors");
    b.fields(r2);
  }, {"cut.safetensors", "metrics.sum"});

  CheckpointData wrong = data;
  for (auto& t : wrong.tensors) {
    if (t.name == "model.weight") t.tensor = at::zeros({3, 2, 5, 5});
  }
  expect_bad_input([&] {
    CheckpointIO r3 = CheckpointIO::reader(wrong, "other.safetensors");
    b.fields(r3);
  }, {"other.safetensors", "model.weight", "[3, 2, 5, 5]", "[3, 2, 3, 3]"});
}

// The torch side's registries build what the torch-free settings registries name (the allowed
// values every tool checks), name for name and in the same order.
TEST(Registries, TheFactoriesAreTheSettingsNames) {
  EXPECT_EQ(nn::model_registry().names(), nn::model_settings_registry().names());
  EXPECT_EQ(loss_registry().names(), loss_settings_registry().names());
  EXPECT_EQ(optimizer_registry().names(), optimizer_settings_registry().names());
  EXPECT_EQ(optimizer_registry().names(), (std::vector<std::string>{"adamw", "sgd"}));
}

TEST(Registries, UnknownNamesListTheKnownOnes) {
  nn::ModelOptions m;
  m.name = "resnet9";
  expect_bad_input([&] { nn::make_model(m, 1, 28, 28, 10); }, {"model.name", "resnet9", "fmnist_cnn"});
  LossSection l;
  l.name = "hinge";
  expect_bad_input([&] { make_loss({l, 10, c10::Device(c10::kCPU)}); }, {"loss.name", "hinge", "cross_entropy"});
  OptimOptions o;
  o.name = "lamb";
  expect_bad_input([&] { make_optimizer(o, {}); }, {"optim.name", "lamb", "adamw", "sgd"});
}

// Each optimizer's own momentum: AdamW's beta1, SGD's momentum (tune passed beta1 to both).
TEST(Registries, EachOptimizerTakesItsOwnMomentum) {
  OptimOptions o;
  o.beta1 = 0.8;
  o.momentum = 0.95;
  o.name = "adamw";
  EXPECT_EQ(optimizer_momentum(o), 0.8);
  o.name = "sgd";
  EXPECT_EQ(optimizer_momentum(o), 0.95);
}

// cross_entropy: label smoothing and class weights as torch.nn.functional.cross_entropy; the
// per-sample loss (evaluation) has neither smoothing nor a mean; a weight list of the wrong
// length is refused naming the key.
TEST(Registries, CrossEntropyMatchesTorchsDefinition) {
  at::manual_seed(0);
  const at::Tensor logits = at::randn({6, 4});
  const at::Tensor y = at::tensor({0, 1, 2, 3, 1, 1}, at::kLong);
  LossSection opt;
  opt.label_smoothing = 0.2;
  opt.class_weights = {1, 2, 0.5, 1};
  auto loss = make_loss({opt, 4, c10::Device(c10::kCPU)});
  // By hand: smoothed targets q = (1 - s) onehot + s / C; weighted mean over samples of
  // Σ_c w_c q_c (-log p_c), divided by Σ_i w_{y_i} (PyTorch's weighted mean).
  const at::Tensor logp = at::log_softmax(logits, 1);
  const at::Tensor w = at::tensor({1.0, 2.0, 0.5, 1.0}).to(at::kFloat);
  const at::Tensor onehot = at::one_hot(y, 4).to(at::kFloat);
  const at::Tensor nll = -(logp * onehot).sum(1) * w.index_select(0, y);
  const at::Tensor smooth = -(logp * w).sum(1) / 4.0;
  const double expect = ((0.8 * nll.sum() + 0.2 * smooth.sum()) / w.index_select(0, y).sum()).item<double>();
  EXPECT_NEAR(loss->mean(logits, y).item<double>(), expect, 1e-6);
  const at::Tensor per = loss->per_sample(logits, y);
  ASSERT_EQ(per.sizes(), (std::vector<int64_t>{6}));
  EXPECT_TRUE(at::allclose(per, nll, 1e-6, 1e-6));
  opt.class_weights = {1, 2};
  expect_bad_input([&] { make_loss({opt, 4, c10::Device(c10::kCPU)}); }, {"loss.class_weights", "2 weights", "4 classes"});
}

// binary_cross_entropy (multi-label): by hand, each class an independent sigmoid,
//   mean over samples and classes of w_c [-(q log σ(x) - (1 - q) log(1 - σ(x)))], q = t (1 - ε) + ε/2;
// the per-sample loss is the class mean without smoothing (weights kept); class indices
// are one-hot targets; probabilities are sigmoids (cross_entropy's: softmax rows summing to 1).
// cross_entropy refuses multi-label data, at build time and for integer [B, C] targets, naming the
// fix; float [B, C] targets are probabilities (MixUp/CutMix), with label smoothing as torch applies it.
TEST(Registries, BinaryCrossEntropyMatchesItsDefinitionAndCrossEntropyRefusesMultiLabel) {
  at::manual_seed(1);
  const at::Tensor logits = at::randn({6, 4}) * 3;
  const at::Tensor t = at::rand({6, 4}).lt(0.4).to(at::kFloat);
  LossSection opt;
  opt.name = "binary_cross_entropy";
  opt.label_smoothing = 0.2;
  opt.class_weights = {1, 2, 0.5, 1};
  auto loss = make_loss({opt, 4, c10::Device(c10::kCPU), true});
  const at::Tensor x = logits.to(at::kDouble), w = at::tensor({1.0, 2.0, 0.5, 1.0}, at::kDouble);
  auto by_hand = [&](const at::Tensor& q) {  // [6, 4] in double
    return -(q * at::log(at::sigmoid(x)) + (1 - q) * at::log(1 - at::sigmoid(x))) * w;
  };
  const at::Tensor q0 = t.to(at::kDouble) * 0.8 + 0.1;
  EXPECT_NEAR(loss->mean(logits, t).item<double>(), by_hand(q0).mean().item<double>(), 1e-6);
  const at::Tensor per = loss->per_sample(logits, t);
  ASSERT_EQ(per.sizes(), (std::vector<int64_t>{6}));
  EXPECT_TRUE(at::allclose(per.to(at::kDouble), by_hand(t.to(at::kDouble)).mean(1), 1e-6, 1e-6));
  // Class indices: one-hot targets.
  const at::Tensor y = at::tensor({0, 3, 2, 2, 1, 0}, at::kLong);
  EXPECT_NEAR(loss->mean(logits, y).item<double>(), loss->mean(logits, at::one_hot(y, 4).to(at::kFloat)).item<double>(),
              1e-7);
  EXPECT_TRUE(at::allclose(loss->probabilities(logits), at::sigmoid(logits)));
  // cross_entropy: softmax probabilities; multi-label data refused.
  LossSection ce;
  auto ce_loss = make_loss({ce, 4, c10::Device(c10::kCPU)});
  EXPECT_TRUE(at::allclose(ce_loss->probabilities(logits).sum(1), at::ones({6})));
  expect_bad_input([&] { make_loss({ce, 4, c10::Device(c10::kCPU), true}); },
                   {"cross_entropy", "multi-label", "binary_cross_entropy"});
  expect_bad_input([&] { ce_loss->mean(logits, t.to(at::kLong)); }, {"multi-label", "binary_cross_entropy"});
  // Float [B, C] targets are class probabilities (MixUp/CutMix's soft targets), as torch takes
  // them: -sum_c w_c q_c log softmax(x)_c averaged over the batch, q = p (1 - eps) + eps / C.
  LossSection ce_smooth;
  ce_smooth.label_smoothing = 0.2;
  ce_smooth.class_weights = {1, 2, 0.5, 1};
  auto soft_loss = make_loss({ce_smooth, 4, c10::Device(c10::kCPU)});
  const at::Tensor p = at::softmax(at::randn({6, 4}), 1);
  const at::Tensor logp = at::log_softmax(x, 1);
  const at::Tensor q = p.to(at::kDouble) * 0.8 + 0.2 / 4;
  EXPECT_NEAR(soft_loss->mean(logits, p).item<double>(), (-(q * logp * w).sum(1)).mean().item<double>(), 1e-6);
  EXPECT_TRUE(at::allclose(soft_loss->per_sample(logits, p).to(at::kDouble), -(p.to(at::kDouble) * logp * w).sum(1),
                           1e-6, 1e-6));
  // One-hot probabilities give the class-index loss (unweighted: torch divides the index form by
  // the weights' sum and the probability form by the batch).
  const at::Tensor y1 = at::tensor({0, 3, 2, 2, 1, 0}, at::kLong);
  EXPECT_NEAR(ce_loss->mean(logits, at::one_hot(y1, 4).to(at::kFloat)).item<double>(),
              ce_loss->mean(logits, y1).item<double>(), 1e-6);
  // The hit rules the Evaluator and the step count with: the top class present (precision at 1),
  // a present class among the top k; with class indices, the plain top-1 / top-k.
  const at::Tensor z = at::tensor({0.1, 2.0, -1.0, 0.5, 3.0, 0.0, 1.0, 2.0}, at::kFloat).reshape({2, 4});
  const at::Tensor m = at::tensor({0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0}, at::kFloat).reshape({2, 4});
  auto bools = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); };
  EXPECT_TRUE(top1_hits(z, m).equal(bools({1, 0})));
  EXPECT_TRUE(topk_hits(z, m, 2).equal(bools({1, 0})));
  EXPECT_TRUE(topk_hits(z, m, 3).equal(bools({1, 1})));
  EXPECT_TRUE(top1_hits(z, at::tensor({1, 2}, at::kLong)).equal(bools({1, 0})));
}

}  // namespace
}  // namespace crucible::train
