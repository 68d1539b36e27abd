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
#include "crucible/train/job.h"

namespace crucible::nn {
namespace {

TEST(EvalGuard, EvalModeNoGradAndRestoreM1) {
  compat::seed_cpu_generator(1);
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  m->train(true);
  at::Tensor x = at::randn({4, 1, 28, 28});
  {
    EvalGuard g(*m);
    EXPECT_FALSE(m->is_training());
    EXPECT_FALSE(m->nn_module()->children()[0]->is_training());  // every submodule
    at::Tensor a = m->forward(x), b = m->forward(x);
    EXPECT_FALSE(a.requires_grad());
    EXPECT_TRUE(at::equal(a, b));  // dropout off, BN running stats
  }
  EXPECT_TRUE(m->is_training());
  at::Tensor t1 = m->forward(x);
  EXPECT_TRUE(t1.requires_grad());
  m->train(false);
  { EvalGuard g(*m); }
  EXPECT_FALSE(m->is_training());  // restores what it found
}

TEST(Model, ParameterNamesMatchTheBaseline) {
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.name);
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

// Law 3: the input a model takes is data, compared with what the pipeline delivers. A model
// built from scratch states only its channels; once trained it states order and normalisation
// too, and each mismatch is refused naming both sides. The spec survives its JSON form (how
// checkpoints keep it).
TEST(Model, InputSpecIsCheckedAgainstWhatThePipelineDelivers) {
  auto m = make_model(ModelOptions{}, 1, 28, 28, 10);
  const InputSpec fresh = m->input_spec();
  EXPECT_EQ(fresh.channels, 1);
  EXPECT_FALSE(fresh.order.has_value());
  data::InputConvention gray{1, data::ColorOrder::kGray, {0.286}, {0.353}};
  check_input(fresh, gray, "model fmnist_cnn");  // any normalisation for an untrained model
  data::InputConvention rgb{3, data::ColorOrder::kRGB, {0.5, 0.5, 0.5}, {0.25, 0.25, 0.25}};
  try {
    check_input(fresh, rgb, "model fmnist_cnn");
    ADD_FAILURE() << "3 channels into a 1-channel model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model fmnist_cnn takes 1 channel(s) but the data pipeline delivers 3"),
              std::string::npos)
        << e.what();
  }
  const InputSpec trained = InputSpec::from_json(fresh.trained_on(gray).to_json(), "ckpt");
  ASSERT_TRUE(trained.order.has_value());
  EXPECT_EQ(*trained.order, data::ColorOrder::kGray);
  EXPECT_EQ(trained.mean, gray.mean);
  EXPECT_EQ(trained.std, gray.std);
  check_input(trained, gray, "the model in ckpt");
  data::InputConvention other = gray;
  other.mean = {0.5};
  try {
    check_input(trained, other, "the model in ckpt");
    ADD_FAILURE() << "another normalisation was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    for (const char* s : {"the model in ckpt was trained on", "mean [0.286]", "mean [0.5]", "data.mean"}) {
      EXPECT_NE(what.find(s), std::string::npos) << s << " missing in: " << what;
    }
  }
  const InputSpec trained_rgb = InputSpec::from_json(make_model(ModelOptions{}, 3, 28, 28, 10)->input_spec()
                                                         .trained_on(rgb).to_json(), "ckpt");
  data::InputConvention bgr = rgb;
  bgr.order = data::ColorOrder::kBGR;
  try {
    check_input(trained_rgb, bgr, "the model in ckpt");
    ADD_FAILURE() << "BGR into an RGB-trained model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trained on RGB images but the pipeline delivers BGR"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(InputSpec::from_json("{\"channels\": 1}", "ckpt"), Error);
}

TEST(ParamsSha256, ValuesNotMemoryFormat) {
  compat::seed_cpu_generator(3);
  auto a = make_model(ModelOptions{}, 1, 28, 28, 10);
  compat::seed_cpu_generator(3);
  auto b = make_model(ModelOptions{}, 1, 28, 28, 10);
  to_channels_last(*b);
  EXPECT_TRUE(b->named_parameters()[0].tensor.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(train::params_sha256(*a), train::params_sha256(*b));
  {
    at::NoGradGuard g;
    b->named_parameters()[0].tensor.view(-1)[0].add_(1e-6);
  }
  EXPECT_NE(train::params_sha256(*a), train::params_sha256(*b));
}

}  // namespace
}  // namespace crucible::nn
