// T8: schedules as pure functions of the step. onecycle must equal PyTorch's OneCycleLR (lr
// and AdamW beta1) at every step, and step/cosine/exponential torchvision's chain of torch
// schedulers — python3-torch is the oracle.
#include "crucible/train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/train/job_config.h"
#include "test_util.h"

namespace crucible::train {
namespace {

TEST(Schedule, OneCycleEqualsPytorch) {
  const int total = 97;
  const std::string out = test::run_python(
      "import torch\n"
      "p = torch.nn.Parameter(torch.zeros(1))\n"
      "opt = torch.optim.AdamW([p], lr=0.002)\n"
      "s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.002, total_steps=" + std::to_string(total) + ", pct_start=0.3)\n"
      "for i in range(" + std::to_string(total) + "):\n"
      "    g = opt.param_groups[0]; print(repr(g['lr']), repr(g['betas'][0]))\n"
      "    opt.step(); s.step()\n");
  Schedule s(ScheduleOptions{}, 0.002, 0.9, total);
  std::istringstream in(out);
  for (int i = 0; i < total; ++i) {
    double lr = 0, beta1 = 0;
    ASSERT_TRUE(in >> lr >> beta1) << "step " << i;
    auto p = s.at(i);
    EXPECT_NEAR(p.lr, lr, 1e-15 + 1e-12 * lr) << "step " << i;
    EXPECT_NEAR(p.momentum, beta1, 1e-12) << "step " << i;
  }
}

TEST(Schedule, WarmupCosineRisesThenFalls) {
  ScheduleOptions o;
  o.name = "warmup_cosine";
  o.warmup = 0.1;
  Schedule s(o, 1.0, 0.9, 100);
  EXPECT_NEAR(s.at(0).lr, 1.0 / 25, 1e-12);
  EXPECT_NEAR(s.at(10).lr, 1.0, 1e-12);
  for (int i = 1; i < 10; ++i) EXPECT_GT(s.at(i).lr, s.at(i - 1).lr);
  for (int i = 11; i < 100; ++i) EXPECT_LT(s.at(i).lr, s.at(i - 1).lr);
  EXPECT_NEAR(s.at(99).lr, 1.0 / 25 / 1e4, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(50).momentum, 0.9);
}

TEST(Schedule, RejectsNoRisingPhase) {
  ScheduleOptions o;
  o.warmup = 0.01;
  EXPECT_THROW(Schedule(o, 1.0, 0.9, 50), Error);
  EXPECT_THROW(Schedule(ScheduleOptions{}, 1.0, 0.9, 0), Error);
}

// T8: schedules as pure functions of the step. step, cosine and exponential are torchvision's
// references/classification/train.py: its chain (StepLR / CosineAnnealingLR(T_max = epochs -
// warmup_epochs) / ExponentialLR after LinearLR or ConstantLR, joined by SequentialLR at
// milestone warmup_epochs) built and stepped in python3-torch, once per epoch as train.py does,
// or once per optimizer step (interval "step", epochs counted in steps). crucible's lr must equal
// torch's at every optimizer step. On x86-64 the replay is bit-exact (measured: difference 0, in
// torch 1.13 and 2.x alike); 1e-12 leaves room for a compiler that fuses a*b+c. To add a case,
// add a row to `sets` (warmup 0 rows run only without warm-up).
struct TorchvisionCase {
  std::string name, method, interval;  // method "none": no warm-up
  int64_t epochs, per_epoch, warmup, step_size;
  double gamma, lr_min, decay, lr;
};

std::string python_literal(const TorchvisionCase& c) {
  return fmt::format("('{}', '{}', '{}', {}, {}, {}, {}, {}, {}, {}, {})", c.name, c.method, c.interval,
                     c.epochs, c.per_epoch, c.warmup, c.step_size, c.gamma, c.lr_min, c.decay, c.lr);
}

// `s`'s lr at each of `total` steps against torch's on `line` (one per step), to `rel` relative
// (0: exactly), the optimizer's momentum 0.9 kept; the first three differences named by `what`.
void expect_lrs(const Schedule& s, int64_t total, int64_t per_epoch, const std::string& line, const std::string& what,
                double rel) {
  std::istringstream in(line);
  int64_t wrong = 0;
  for (int64_t step = 0; step < total; ++step) {
    double lr = 0;
    ASSERT_TRUE(in >> lr) << what << " step " << step;
    const Schedule::Point p = s.at(step);
    if (std::abs(p.lr - lr) > rel * std::abs(lr) && wrong++ < 3) {
      ADD_FAILURE() << what << " step " << step << " (epoch " << step / per_epoch << "): crucible "
                    << fmt::format("{}", p.lr) << ", torch " << fmt::format("{}", lr);
    }
    EXPECT_EQ(p.momentum, 0.9);
  }
  EXPECT_EQ(wrong, 0) << what;
  double extra = 0;
  EXPECT_FALSE(in >> extra) << what << ": torch gave more steps";
}

TEST(Schedule, TorchvisionSchedulesEqualPytorchAtEveryStepT8) {
  struct Set {
    int64_t epochs, per_epoch, warmup, step_size;
    double gamma, lr_min, decay, lr;
  };
  const std::vector<Set> sets = {
      {1, 5, 0, 1, 0.5, 0.0, 0.01, 0.1},           // one epoch
      {10, 7, 3, 3, 0.7, 1e-4, 0.01, 0.1},
      {5, 3, 1, 1, 0.5, 0.0, 0.3, 0.0375},         // the milestone after one epoch; a decay every epoch
      {90, 4, 5, 30, 0.1, 1e-5, 0.01, 0.5},        // train.py's defaults, shorter epochs
      {40, 2, 9, 7, 0.97, 0.002, 0.5, 0.2},
      {3, 600, 1, 100, 0.999, 0.0, 0.1, 0.8},      // 1800 steps: replays from many anchors
      {6, 50, 2, 2, 0.9, 0.001, 1.0, 0.1},         // warmup_decay 1: a warm-up that keeps the lr
      {12, 1, 11, 4, 1.25, 0.05, 0.001, 0.003},    // one step per epoch; gamma > 1; lr_min near lr
  };
  std::vector<TorchvisionCase> cases;
  for (const char* name : {"step", "cosine", "exponential"}) {
    for (const char* method : {"linear", "constant", "none"}) {
      for (const char* interval : {"epoch", "step"}) {
        for (const Set& s : sets) {
          const bool none = std::string(method) == "none";
          if (!none && s.warmup == 0) continue;
          cases.push_back({name, method, interval, s.epochs, s.per_epoch, none ? 0 : s.warmup, s.step_size, s.gamma,
                           s.lr_min, s.decay, s.lr});
        }
      }
    }
  }
  std::string rows;
  for (const auto& c : cases) rows += "    " + python_literal(c) + ",\n";
  const std::string out = test::run_python(
      "import warnings\n"
      "warnings.filterwarnings('ignore')  # SequentialLR's step(0) is deprecated in torch\n"
      "import torch\n"
      "from torch.optim import lr_scheduler as L\n"
      "def lrs(name, method, interval, epochs, per_epoch, warmup, step_size, gamma, lr_min, decay, lr):\n"
      "    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=0.9)\n"
      "    per = 1 if interval == 'epoch' else per_epoch  # scheduler steps per epoch\n"
      "    warm = warmup * per\n"
      "    # train.py, epochs counted in scheduler steps\n"
      "    if name == 'step':\n"
      "        main = L.StepLR(opt, step_size=step_size, gamma=gamma)\n"
      "    elif name == 'cosine':\n"
      "        main = L.CosineAnnealingLR(opt, T_max=epochs * per - warm, eta_min=lr_min)\n"
      "    else:\n"
      "        main = L.ExponentialLR(opt, gamma=gamma)\n"
      "    if warm > 0:\n"
      "        if method == 'linear':\n"
      "            w = L.LinearLR(opt, start_factor=decay, total_iters=warm)\n"
      "        else:\n"
      "            w = L.ConstantLR(opt, factor=decay, total_iters=warm)\n"
      "        s = L.SequentialLR(opt, schedulers=[w, main], milestones=[warm])\n"
      "    else:\n"
      "        s = main\n"
      "    out = []\n"
      "    for epoch in range(epochs):\n"
      "        for _ in range(per_epoch):\n"
      "            out.append(opt.param_groups[0]['lr'])\n"
      "            opt.step()\n"
      "            if interval == 'step':\n"
      "                s.step()\n"
      "        if interval == 'epoch':\n"
      "            s.step()\n"
      "    return out\n"
      "for c in [\n" + rows + "]:\n"
      "    print(' '.join(repr(x) for x in lrs(*c)))\n");
  std::istringstream lines(out);
  for (const auto& c : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << python_literal(c);
    ScheduleOptions o;
    o.name = c.name;
    o.interval = c.interval;
    o.warmup_epochs = c.warmup;
    if (c.method != "none") o.warmup_method = c.method;
    o.warmup_decay = c.decay;
    o.step_size = c.step_size;
    o.gamma = c.gamma;
    o.lr_min = c.lr_min;
    const int64_t total = c.epochs * c.per_epoch;
    expect_lrs(Schedule(o, c.lr, 0.9, total, c.per_epoch), total, c.per_epoch, line, python_literal(c), 1e-12);
  }
}

// T8: "multistep" equals torchvision's detection reference at every optimizer step: train.py's
// MultiStepLR(milestones, gamma) stepped per epoch, and in the first epoch engine.py's
// LinearLR(start_factor, total_iters = min(warmup_iters, iterations - 1)) stepped after every
// iteration (both acting on the same lr, each from the one before). Cases: the recipe's shape
// (warm-up shorter than the epoch), a warm-up longer than the epoch (cut to iterations - 1), one
// iteration per epoch (torch's LinearLR with total_iters 0 never restores the lr: so neither
// does crucible), a repeated milestone (gamma squared), no warm-up, a milestone past the end.
TEST(Schedule, MultiStepEqualsTorchvisionDetectionReferenceT8) {
  struct Case {
    int64_t epochs, per_epoch, warmup_iters;
    double factor;
    std::vector<double> milestones;
    double gamma, lr;
  };
  const std::vector<Case> cases = {
      {26, 12, 5, 0.001, {16, 22}, 0.1, 0.01},
      {6, 40, 1000, 0.001, {2, 4}, 0.1, 0.02},
      {5, 1, 1000, 0.001, {2}, 0.5, 0.1},
      {8, 7, 3, 0.25, {3, 3, 6}, 0.3, 0.05},
      {4, 9, 0, 0.001, {1, 2}, 0.1, 0.04},
      {3, 300, 250, 0.01, {9}, 0.1, 0.01},
  };
  std::string rows;
  for (const auto& c : cases) {
    rows += fmt::format("    ({}, {}, {}, {}, [{}], {}, {}),\n", c.epochs, c.per_epoch, c.warmup_iters, c.factor,
                        fmt::join(c.milestones, ", "), c.gamma, c.lr);
  }
  const std::string out = test::run_python(
      "import warnings\n"
      "warnings.filterwarnings('ignore')\n"
      "import torch\n"
      "from torch.optim import lr_scheduler as L\n"
      "def lrs(epochs, per_epoch, warmup_iters, factor, milestones, gamma, lr):\n"
      "    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=0.9)\n"
      "    main = L.MultiStepLR(opt, milestones=[int(m) for m in milestones], gamma=gamma)  # train.py\n"
      "    out = []\n"
      "    for epoch in range(epochs):\n"
      "        warm = None\n"
      "        if epoch == 0 and warmup_iters > 0:  # engine.py's train_one_epoch\n"
      "            warm = L.LinearLR(opt, start_factor=factor, total_iters=min(warmup_iters, per_epoch - 1))\n"
      "        for _ in range(per_epoch):\n"
      "            out.append(opt.param_groups[0]['lr'])\n"
      "            opt.step()\n"
      "            if warm is not None: warm.step()\n"
      "        main.step()\n"
      "    return out\n"
      "for c in [\n" + rows + "]:\n"
      "    print(' '.join(repr(x) for x in lrs(*c)))\n");
  std::istringstream lines(out);
  for (const auto& c : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << out;
    ScheduleOptions o;
    o.name = "multistep";
    o.milestones = c.milestones;
    o.gamma = c.gamma;
    o.warmup_iters = c.warmup_iters;
    o.warmup_factor = c.factor;
    const int64_t total = c.epochs * c.per_epoch;
    expect_lrs(Schedule(o, c.lr, 0.9, total, c.per_epoch), total, c.per_epoch, line,
               fmt::format("epochs {} × {}", c.epochs, c.per_epoch), 0.0);
  }
  using test::expect_bad_input;
  ScheduleOptions bad;
  bad.name = "multistep";
  bad.milestones = {2.5};
  expect_bad_input([&] { Schedule(bad, 0.1, 0.9, 40, 10); }, {"schedule.milestones", "2.5"});
  bad.milestones = {2};
  expect_bad_input([&] { Schedule(bad, 0.1, 0.9, 40, 0); }, {"multistep", "steps per epoch"});
}

TEST(Schedule, TorchvisionBadKeysNameTheKey) {
  const auto make = [](const std::string& name, const std::function<void(ScheduleOptions&)>& set,
                       int64_t per_epoch = 10) {  // 5 epochs of 10 steps
    ScheduleOptions o;
    o.name = name;
    set(o);
    Schedule(o, 0.1, 0.9, 50, per_epoch);
  };
  using test::expect_bad_input;
  expect_bad_input([&] { make("cosine", [](ScheduleOptions& o) { o.warmup_epochs = 5; }); },
                   {"schedule.warmup_epochs = 5", "fewer than train.epochs = 5"});
  expect_bad_input([&] { make("step", [](ScheduleOptions& o) { o.warmup_epochs = 7; }); },
                   {"schedule.warmup_epochs = 7", "train.epochs = 5"});
  expect_bad_input([&] { make("step", [](ScheduleOptions& o) { o.warmup_epochs = -1; }); },
                   {"schedule.warmup_epochs", "≥ 0", "-1"});
  expect_bad_input([&] { make("step", [](ScheduleOptions& o) { o.step_size = 0; }); },
                   {"schedule.step_size", "≥ 1", "found 0"});
  expect_bad_input([&] { make("cosine", [](ScheduleOptions& o) { o.warmup_method = "cosine"; }); },
                   {"schedule.warmup_method", "\"linear\" or \"constant\"", "found \"cosine\""});
  expect_bad_input([&] { make("exponential", [](ScheduleOptions& o) { o.interval = "batch"; }); },
                   {"schedule.interval", "\"epoch\" or \"step\"", "found \"batch\""});
  expect_bad_input([&] { make("cosine", [](ScheduleOptions& o) { o.warmup_decay = 0; }); },
                   {"schedule.warmup_decay", "(0, 1]", "found 0"});
  expect_bad_input([&] { make("cosine", [](ScheduleOptions& o) { o.warmup_decay = 1.5; }); },
                   {"schedule.warmup_decay", "found 1.5"});
  expect_bad_input([&] { make("exponential", [](ScheduleOptions& o) { o.gamma = 0; }); },
                   {"schedule.gamma", "> 0", "found 0"});
  expect_bad_input([&] { make("cosine", [](ScheduleOptions& o) { o.lr_min = -1e-3; }); },
                   {"schedule.lr_min", "≥ 0", "found -0.001"});
  expect_bad_input([&] { make("cosine_annealing", [](ScheduleOptions&) {}); },
                   {"schedule.name", "cosine_annealing", "step, cosine, exponential"});
  expect_bad_input([&] { make("cosine", [](ScheduleOptions&) {}, 0); }, {"steps per epoch"});
  // What the trainer builds from a config: the keys' own checks come first.
  JobConfig job;
  ConfigSchema schema;
  bind_job_config(job, schema);
  expect_bad_input([&] { schema.apply_override("schedule.warmup_method=cosine"); },
                   {"schedule.warmup_method", "cosine", "linear"});
  expect_bad_input([&] { schema.apply_override("schedule.step_size=0"); }, {"schedule.step_size"});
  schema.apply_override("schedule.name=cosine");
  schema.apply_override("schedule.warmup_epochs=2");
  schema.apply_override("schedule.interval=step");
  EXPECT_EQ(job.schedule.name, "cosine");
  EXPECT_EQ(job.schedule.warmup_epochs, 2);
  EXPECT_EQ(job.schedule.interval, "step");
}

TEST(Schedule, TorchvisionDescribeIsOneLine) {
  ScheduleOptions o;
  o.name = "cosine";
  o.warmup_epochs = 2;
  o.warmup_method = "linear";
  const std::string d = Schedule(o, 0.5, 0.9, 10 * 4, 4).describe();
  EXPECT_EQ(d.find('\n'), std::string::npos) << d;
  for (const char* part : {"cosine", "linear warm-up", "over 2 epochs", "0.5", "over 8 epochs"}) {
    EXPECT_NE(d.find(part), std::string::npos) << d;
  }
  o.interval = "step";
  const std::string ds = Schedule(o, 0.5, 0.9, 10 * 4, 4).describe();
  EXPECT_NE(ds.find("over 8 steps"), std::string::npos) << ds;
  EXPECT_NE(ds.find("over 32 steps"), std::string::npos) << ds;
}

}  // namespace
}  // namespace crucible::train

namespace crucible::train {
namespace {

// M4: a step's size is a function of (seed, step) alone — what every rank computes for itself,
// and what a resumed run computes again — and uses every size about equally.
TEST(MultiScale, SizeIsAFunctionOfSeedAndStepM4) {
  const std::vector<int64_t> sizes = {24, 28, 32};
  std::map<int64_t, int> count;
  int differs = 0;
  for (int64_t step = 0; step < 3000; ++step) {
    const int64_t s = multi_scale_size(7, step, sizes);
    EXPECT_EQ(s, multi_scale_size(7, step, sizes));  // another rank, or after a resume
    ++count[s];
    differs += s != multi_scale_size(8, step, sizes);
  }
  ASSERT_EQ(count.size(), 3u);
  for (const auto& [size, n] : count) EXPECT_NEAR(n, 1000, 120) << size;
  EXPECT_GT(differs, 1500);  // another seed, another sequence
  EXPECT_EQ(multi_scale_size(7, 5, {40}), 40);
}

}  // namespace
}  // namespace crucible::train
