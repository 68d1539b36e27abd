// T8/T10: AdamW and SGD(Nesterov) follow torch.optim exactly (python3-torch as oracle) over
// several steps with one-cycle lr and beta1; zero_grad sets gradients to none; state
// round-trips.
#include "crucible/train/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

// T3: with float16 parameters an eps of 1e-8 would vanish; it is raised and said so. fp32
// parameters (autocast keeps them fp32) keep it.
TEST(Optimizer, EpsGuardForHalfParametersT3) {
  at::Tensor p = at::ones({4}, at::kHalf).set_requires_grad(true);
  ParamGroup g;
  g.params.push_back({"w", p});
  ::testing::internal::CaptureStderr();
  auto opt = make_optimizer(OptimOptions{}, {g});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("(T3)"), std::string::npos) << err;
  EXPECT_NE(opt->describe().find("eps 6.1035"), std::string::npos) << opt->describe();
  ParamGroup f;
  f.params.push_back({"w", at::ones({4}).set_requires_grad(true)});
  EXPECT_NE(make_optimizer(OptimOptions{}, {f})->describe().find("eps 1e-08"), std::string::npos);
}

}  // namespace
}  // namespace crucible::train
