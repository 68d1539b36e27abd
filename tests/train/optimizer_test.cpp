// T8/T10: AdamW and SGD(Nesterov) follow torch.optim exactly (python3-torch as oracle) over
// several steps with one-cycle lr and beta1; zero_grad sets gradients to none; state
// round-trips.
#include "crucible/train/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "crucible/train/schedule.h"
#include "test_util.h"

namespace crucible::train {
namespace {

at::Tensor from_json(const nlohmann::json& j, std::vector<int64_t> shape) {
  std::vector<float> v = j.get<std::vector<float>>();
  return at::tensor(v).view(shape).clone();
}

// Python runs `optim_ctor` for 6 steps with OneCycleLR and prints the trajectory as JSON.
void compare_with_torch(const std::string& optim_ctor, const OptimOptions& opts) {
  const std::string out = test::run_python(
      "import torch, json\n"
      "torch.manual_seed(0)\n"
      "p = torch.nn.Parameter(torch.randn(3, 4))\n"
      "init = p.detach().clone()\n"
      "grads = [torch.randn(3, 4) for _ in range(6)]\n"
      "opt = " + optim_ctor + "\n"
      "s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=6, pct_start=0.5)\n"
      "for g in grads:\n"
      "    p.grad = g.clone(); opt.step(); opt.zero_grad(set_to_none=True); s.step()\n"
      "print(json.dumps({'init': init.flatten().tolist(), 'grads': [g.flatten().tolist() for g in grads],\n"
      "                  'final': p.detach().flatten().tolist()}))\n");
  auto j = nlohmann::json::parse(out);
  at::Tensor p = from_json(j["init"], {3, 4}).set_requires_grad(true);
  ParamGroup g;
  g.params.push_back({"p", p});
  g.weight_decay = opts.weight_decay;
  auto opt = make_optimizer(opts, {g});
  ScheduleOptions so;
  so.warmup = 0.5;
  Schedule sched(so, 0.01, opts.name == "adamw" ? opts.beta1 : opts.momentum, 6);
  for (int i = 0; i < 6; ++i) {
    p.mutable_grad() = from_json(j["grads"][i], {3, 4});
    auto sp = sched.at(i);
    opt->step(sp.lr, sp.momentum);
    opt->zero_grad();
    EXPECT_FALSE(p.grad().defined());  // T10: set to none
  }
  at::Tensor expect = from_json(j["final"], {3, 4});
  EXPECT_TRUE(at::allclose(p.detach(), expect, 1e-6, 1e-7)) << (p.detach() - expect).abs().max().item<float>();
}

TEST(Optimizer, AdamWEqualsTorch) {
  OptimOptions o;
  o.weight_decay = 0.05;
  compare_with_torch("torch.optim.AdamW([p], lr=0.01, weight_decay=0.05)", o);
}

TEST(Optimizer, SgdNesterovEqualsTorch) {
  OptimOptions o;
  o.name = "sgd";
  o.weight_decay = 0.01;
  o.momentum = 0.9;
  compare_with_torch("torch.optim.SGD([p], lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)", o);
}

TEST(Optimizer, StateRoundTrips) {
  at::Tensor p = at::randn({5}).set_requires_grad(true);
  ParamGroup g;
  g.params.push_back({"w", p});
  auto a = make_optimizer(OptimOptions{}, {g});
  p.mutable_grad() = at::ones({5});
  a->step(0.1, 0.9);
  auto state = a->state();
  ASSERT_EQ(state.size(), 3u);  // step, exp_avg, exp_avg_sq
  at::Tensor q = p.detach().clone().set_requires_grad(true);
  ParamGroup g2;
  g2.params.push_back({"w", q});
  auto b = make_optimizer(OptimOptions{}, {g2});
  b->load_state(state);
  p.mutable_grad() = at::full({5}, 0.5);
  q.mutable_grad() = at::full({5}, 0.5);
  a->step(0.1, 0.9);
  b->step(0.1, 0.9);
  EXPECT_TRUE(at::equal(p, q));
}

}  // namespace
}  // namespace crucible::train

namespace crucible::train {
namespace {

// T3: an update on float16 parameters uses eps raised to float16's smallest normal number
// (1e-8 would vanish in half precision), with moments kept in fp32; bfloat16 shares fp32's
// exponent range and keeps eps. The updates are compared with AdamW's formula in double.
TEST(Optimizer, EpsGuardForHalfParametersT3) {
  // Gradients near float16's smallest normal: here eps decides the step's size.
  const std::vector<double> grads = {2e-5, -3e-5, 1e-4, 0.0};
  const double lr = 0.01, beta1 = 0.9, beta2 = 0.999;
  // One AdamW step from 1.0 with gradient g, in double, for a given eps (no weight decay).
  auto expected = [&](double g, double eps) {
    const double m = (1 - beta1) * g, v = (1 - beta2) * g * g;
    return 1.0 - lr / (1 - beta1) * m / (std::sqrt(v) / std::sqrt(1 - beta2) + eps);
  };
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    at::Tensor p = at::ones({4}, dtype).set_requires_grad(true);
    ParamGroup g;
    g.params.push_back({"w", p});
    OptimOptions o;
    o.weight_decay = 0;
    ::testing::internal::CaptureStderr();
    auto opt = make_optimizer(o, {g});
    const std::string err = ::testing::internal::GetCapturedStderr();
    p.mutable_grad() = at::tensor(std::vector<float>(grads.begin(), grads.end())).to(dtype);
    opt->step(lr, beta1);
    for (const auto& s : opt->state()) {
      if (s.name != "step") {
        EXPECT_EQ(s.tensor.scalar_type(), at::kFloat) << s.name;  // moments in fp32
      }
    }
    const at::Tensor got = p.detach().to(at::kDouble);
    const double eps = dtype == at::kHalf ? 6.103515625e-05 : 1e-8;
    for (size_t i = 0; i < grads.size(); ++i) {
      // The parameter is rounded to its own type; compare at that precision.
      const double tol = dtype == at::kHalf ? 1e-3 : 8e-3;
      EXPECT_NEAR(got[static_cast<int64_t>(i)].item<double>(), expected(grads[i], eps), tol)
          << c10::toString(dtype) << " grad " << grads[i];
    }
    if (dtype == at::kHalf) {
      EXPECT_NE(err.find("(T3)"), std::string::npos) << err;  // and it says so
      // Without the guard the 2e-5 step is ~lr (1 - 0.01 = 0.990); with it, 1 - 0.01·(2e-5/8.1e-5).
      EXPECT_GT(got[0].item<double>(), 0.996);
    } else {
      EXPECT_EQ(err.find("(T3)"), std::string::npos) << err;
    }
    EXPECT_TRUE(at::isfinite(p.detach()).all().item<bool>());  // a zero gradient gives no NaN
  }
}

// Sgd refuses a momentum buffer of another shape, naming it, as AdamW does for its moments.
TEST(Optimizer, SgdStateOfAnotherShapeIsRefused) {
  OptimOptions o;
  o.name = "sgd";
  ParamGroup g;
  g.params.push_back({"layer.weight", at::zeros({3, 4}).set_requires_grad(true)});
  auto opt = make_optimizer(o, {g});
  test::expect_bad_input([&] { opt->load_state({{"layer.weight.momentum_buffer", at::zeros({4, 3})}}); },
                         {"layer.weight.momentum_buffer", "[4, 3]", "[3, 4]"});
  test::expect_bad_input([&] { opt->load_state({{"layer.weight.momentum_buffer", at::zeros({3, 4}, at::kInt)}}); },
                         {"layer.weight.momentum_buffer", "Int"});
  opt->load_state({{"layer.weight.momentum_buffer", at::ones({3, 4})}});  // the right shape loads
  EXPECT_EQ(opt->state().size(), 1u);
}

}  // namespace
}  // namespace crucible::train
