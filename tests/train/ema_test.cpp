// The weight EMA (train.ema) against its reference, torchvision's classification recipe
// (references/classification/train.py --model-ema and utils.ExponentialMovingAverage, an
// AveragedModel with use_buffers=True), with python3-torch as the oracle:
// - WeightEma fed a random sequence of state dicts (BatchNorm buffers included, the integer
//   num_batches_tracked too) on train.py's iteration rule, warm-up resets included, equals
//   AveragedModel fed the same sequence after every iteration, dtypes included; ema_decay equals
//   train.py's adjustment;
// - a 100-step training run (a TorchScript model with BatchNorm): the model's weights after each
//   step, fed to AveragedModel on train.py's rule, give the EMA the run's last checkpoint holds and
//   the run wrote back as model_ema.safetensors; the EMA is evaluated beside the model;
// - a run stopped at a mid-epoch step (as Ctrl-C stops it: checkpoint, no evaluation) and resumed
//   ends with the uninterrupted run's params_sha256 and EMA (law 1, law 5).
#include "crucible/train/ema.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/model.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/job.h"
#include "crucible/train/job_config.h"
#include "crucible/train/recipe.h"
#include "crucible/train/trainer.h"
#include "test_util.h"

namespace crucible::train {
namespace {

using nlohmann::json;

// torchvision's references/classification/utils.py, as the brief quotes it.
const char* kTorchvisionEma = R"(
class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param
        super().__init__(model, device, ema_avg, use_buffers=True)
)";

// Python: reader(path) gives T(name), the tensor `name` of a safetensors file, and the file's
// metadata (an independent reader: json + numpy).
const char* kReader = R"(import json, struct, numpy as np, torch
def reader(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])
    def T(name):
        m = h[name]; s, e = m['data_offsets']
        dt = {'F32': np.float32, 'I64': np.int64}[m['dtype']]
        return torch.from_numpy(np.frombuffer(b[8+n+s:8+n+e], dtype=dt).reshape(m['shape']).copy())
    return T, h.get('__metadata__', {})
)";

void write_tensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors) {
  std::vector<at::Tensor> keep(tensors.size());
  std::vector<io::TensorBytes> bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bytes.push_back(io::tensor_bytes(tensors[i].name, tensors[i].tensor.detach().to(at::kCPU), keep[i]));
  }
  io::write_safetensors(path, bytes, {});
}

std::vector<nn::NamedTensor> prefixed(const std::string& prefix, const std::vector<nn::NamedTensor>& tensors) {
  std::vector<nn::NamedTensor> out;
  for (const auto& t : tensors) out.push_back({prefix + t.name, t.tensor.detach().to(at::kCPU).clone()});
  return out;
}

// A state dict of torch.nn's Conv2d(3, 4, 3, bias=False), BatchNorm2d(4), Linear(7, 5): the
// parameters, then the buffers, in the order parameters() and buffers() list them. The
// convolution weight is channels_last, as the trainer keeps it.
std::vector<nn::NamedTensor> random_state(int64_t k) {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  return {{"conv.weight", at::randn({4, 3, 3, 3}, f).contiguous(at::MemoryFormat::ChannelsLast)},
          {"bn.weight", at::randn({4}, f)},
          {"bn.bias", at::randn({4}, f)},
          {"fc.weight", at::randn({5, 7}, f)},
          {"fc.bias", at::randn({5}, f)},
          {"bn.running_mean", at::randn({4}, f)},
          {"bn.running_var", at::rand({4}, f) + 0.5},
          // The step count a BatchNorm keeps: averaged in float32 and truncated back to int64.
          {"bn.num_batches_tracked", at::scalar_tensor(1000 + 37 * k, at::kLong)}};
}

TEST(WeightEma, EqualsTorchvisionExponentialMovingAverageOnRandomStateDicts) {
  test::TempDir d;
  constexpr int64_t kIterations = 100, kPerEpoch = 10, kEvery = 3, kWarmupEpochs = 1;
  TrainSection t;
  EmaOptions e;
  e.decay = 0.99;
  e.steps = kEvery;
  t.batch_size = 32;
  t.epochs = kIterations / kPerEpoch;
  const double decay = ema_decay(e, t, /*world_size=*/1);  // 1 − min(1, 0.01 × 32 × 3 / 10) ≈ 0.904

  at::manual_seed(7);
  const std::vector<nn::NamedTensor> init = random_state(-1);
  std::vector<nn::NamedTensor> file = prefixed("init.", init);
  WeightEma ema(init, decay);  // AveragedModel's deepcopy of the model
  // train.py's loop: after the step of iteration i of `epoch`, update when i % steps == 0 and,
  // during the lr warm-up, reset n_averaged so that the next update copies again.
  for (int64_t k = 0; k < kIterations; ++k) {
    const int64_t epoch = k / kPerEpoch, i = k % kPerEpoch;
    const std::vector<nn::NamedTensor> model = random_state(k);
    for (auto& x : prefixed(fmt::format("s{}.", k), model)) file.push_back(std::move(x));
    if (i % kEvery == 0) {
      ema.update(model);
      if (epoch < kWarmupEpochs) ema.reset_count();
    }
    for (auto& x : prefixed(fmt::format("e{}.", k), ema.tensors())) file.push_back(std::move(x));
  }
  for (const auto& x : ema.tensors()) {
    EXPECT_EQ(x.tensor.scalar_type(), x.name == "bn.num_batches_tracked" ? at::kLong : at::kFloat) << x.name;
  }
  EXPECT_TRUE(ema.tensors()[0].tensor.is_contiguous(at::MemoryFormat::ChannelsLast));  // the model's layout kept
  write_tensors(d / "seq.safetensors", file);

  const std::string out = test::run_python(
      std::string(kReader) + kTorchvisionEma + "T, _ = reader('" + (d / "seq.safetensors") + "')\n" +
      "torch.manual_seed(0)\n"
      "class M(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)\n"
      "        self.bn = torch.nn.BatchNorm2d(4)\n"
      "        self.fc = torch.nn.Linear(7, 5)\n"
      "model = M()\n"
      "names = list(model.state_dict().keys())\n"
      "def load(prefix): model.load_state_dict({k: T(prefix + k) for k in names})\n"
      "world_size, batch_size, model_ema_steps, epochs, model_ema_decay, lr_warmup_epochs = 1, 32, 3, 10, 0.99, 1\n"
      "adjust = world_size * batch_size * model_ema_steps / epochs\n"
      "alpha = 1.0 - model_ema_decay\n"
      "alpha = min(1.0, alpha * adjust)\n"
      "load('init.')\n"
      "model_ema = ExponentialMovingAverage(model, device='cpu', decay=1.0 - alpha)\n"
      "worst, exact, dtypes = 0.0, True, True\n"
      "for k in range(100):\n"
      "    epoch, i = divmod(k, 10)\n"
      "    load('s%d.' % k)\n"
      "    if i % model_ema_steps == 0:\n"
      "        model_ema.update_parameters(model)\n"
      "        if epoch < lr_warmup_epochs:\n"
      "            model_ema.n_averaged.fill_(0)\n"
      "    ref = model_ema.module.state_dict()\n"
      "    for name in names:\n"
      "        mine = T('e%d.' % k + name)\n"
      "        dtypes = dtypes and mine.dtype == ref[name].dtype\n"
      "        worst = max(worst, (mine.double() - ref[name].double()).abs().max().item())\n"
      "        exact = exact and torch.equal(mine, ref[name])\n"
      "print(json.dumps({'decay': 1.0 - alpha, 'max_diff': worst, 'exact': exact, 'dtypes': dtypes,\n"
      "                  'n_averaged': int(model_ema.n_averaged), 'nbt': int(model_ema.module.bn.num_batches_tracked)}))\n");
  const json r = json::parse(out);
  EXPECT_EQ(r["decay"].get<double>(), decay);  // ema_decay() is train.py's arithmetic, to the bit
  EXPECT_TRUE(r["dtypes"].get<bool>());
  EXPECT_LE(r["max_diff"].get<double>(), 1e-6);
  EXPECT_TRUE(r["exact"].get<bool>()) << "max difference " << r["max_diff"];
  EXPECT_EQ(r["n_averaged"].get<int64_t>(), ema.n_averaged());
  std::printf("WeightEma vs AveragedModel over %lld iterations: decay %.17g, max |difference| %g (bitwise equal: %s), "
              "num_batches_tracked %lld\n",
              static_cast<long long>(kIterations), decay, r["max_diff"].get<double>(),
              r["exact"].get<bool>() ? "yes" : "no", static_cast<long long>(r["nbt"].get<int64_t>()));
}

TEST(WeightEma, DecayIsGivenOrAdjustedAndClampedAsTrainPy) {
  TrainSection t;  // defaults: batch 256, 10 epochs
  EmaOptions e;    // defaults: 0.99998, every 32 steps
  EXPECT_DOUBLE_EQ(ema_decay(e, t, 1), 1.0 - (1.0 - 0.99998) * (256.0 * 32 / 10));
  EXPECT_DOUBLE_EQ(ema_decay(e, t, 4), 1.0 - (1.0 - 0.99998) * (4 * 256.0 * 32 / 10));
  e.decay = 0.9;  // alpha 0.1 × 819.2 > 1: clamped, the average is the weights
  EXPECT_EQ(ema_decay(e, t, 1), 0.0);
  e.adjust = false;
  EXPECT_EQ(ema_decay(e, t, 8), 0.9);
  EXPECT_THROW((WeightEma({}, 1.5)), Error);
  WeightEma ema({{"w", at::zeros({2})}}, 0.5);
  EXPECT_THROW((ema.update({{"w", at::zeros({3})}})), Error);              // another shape
  EXPECT_THROW((ema.update({{"v", at::zeros({2})}})), Error);              // another name
  EXPECT_THROW((ema.update({{"w", at::zeros({2}, at::kDouble)}})), Error);  // another dtype
}

// A TorchScript model with BatchNorm, small enough to keep its weights after every step.
const char* kNet = R"(import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)
    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.conv2(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)
)";

// Each step's weights (after the update) as the loop reports them to step observers.
struct Trace {
  std::vector<nn::NamedTensor> weights;  // "s<step>.<name>", on the CPU
  std::vector<std::string> names;        // parameters then buffers
};

class TracingObserver final : public StepObserver {
 public:
  explicit TracingObserver(std::shared_ptr<Trace> t) : t_(std::move(t)) {}
  void after_update(const StepEvent& e) override {
    std::vector<nn::NamedTensor> all = e.model.named_parameters();
    for (auto& b : e.model.named_buffers()) all.push_back(std::move(b));
    if (t_->names.empty()) {
      for (const auto& x : all) t_->names.push_back(x.name);
    }
    for (auto& x : prefixed(fmt::format("s{}.", e.step), all)) t_->weights.push_back(std::move(x));
  }
  std::string describe() const override { return "tracing"; }

 private:
  std::shared_ptr<Trace> t_;
};

TEST(EmaTraining, HundredStepsEqualAveragedModelFedTheSameWeights) {
  test::TempDir d;
  test::run_python(std::string(kNet) + "import numpy as np\n"
                   "d = '" + d.path() + "/'\n"
                   "rng = np.random.default_rng(0)\n"
                   "for split, n in (('train', 640), ('test', 96)):\n"
                   "    np.save(d + split + '_x.npy', rng.standard_normal((n, 2, 8, 8)).astype(np.float32))\n"
                   "    np.save(d + split + '_y.npy', rng.integers(0, 4, n).astype(np.int64))\n"
                   "torch.manual_seed(0)\n"
                   "torch.jit.save(torch.jit.script(Net()), d + 'net.pt')\n");
  JobConfig j;
  j.run.dir = d.path();
  j.run.name = "ema";
  j.model.name = "torchscript";
  j.model.path = d / "net.pt";
  j.data.dataset = DataSection::Dataset::kArrays;
  j.data.train_images = d / "train_x.npy";
  j.data.train_labels = d / "train_y.npy";
  j.data.test_images = d / "test_x.npy";
  j.data.test_labels = d / "test_y.npy";
  j.data.threads = 1;
  j.train.epochs = 5;  // 640 / 32 = 20 steps an epoch: 100 steps
  j.train.batch_size = 32;
  j.train.eval_batch_size = 32;
  j.train.precision = PrecisionMode::kFp32;
  j.train.channels_last = false;
  j.optim.lr = 0.01;
  j.schedule.name = "cosine";
  j.schedule.warmup_epochs = 1;  // train.py: the EMA copies the weights during the lr warm-up
  j.checkpoint.every_steps = 1000;
  j.log.progress = "none";
  EmaOptions& ema_options = j.pieces.of<EmaOptions>(kEmaPiece);
  ema_options.enabled = true;
  ema_options.steps = 3;
  ema_options.decay = 0.99;  // adjusted: 1 − min(1, 0.01 × 32 × 3 / 5) = 0.808
  auto trace = std::make_shared<Trace>();
  testing::set_extra_step_observer([trace](const Job&) { return std::make_unique<TracingObserver>(trace); });
  const TrainSummary s = Trainer(j).run();
  testing::set_extra_step_observer(nullptr);
  ASSERT_EQ(s.steps, 100);
  ASSERT_EQ(trace->weights.size(), 100 * trace->names.size());
  write_tensors(d / "steps.safetensors", trace->weights);
  const std::string ckpt = d / "ema/checkpoints/ckpt-000000100.safetensors";

  std::string names = "[";
  for (const auto& n : trace->names) names += "'" + n + "', ";
  names += "]";
  // The run's EMA, from its last checkpoint and from model_ema.safetensors, against
  // AveragedModel fed the model's weights after each of the 100 steps on train.py's rule.
  const std::string out = test::run_python(
      std::string(kNet) + kReader + kTorchvisionEma + "steps, _ = reader('" + (d / "steps.safetensors") + "')\n"
      "names = " + names + "\n"
      "model = Net()\n"
      "assert sorted(names) == sorted(model.state_dict().keys()), names\n"
      "def load(prefix): model.load_state_dict({k: steps(prefix + k) for k in names})\n"
      "world_size, batch_size, model_ema_steps, epochs, model_ema_decay, lr_warmup_epochs = 1, 32, 3, 5, 0.99, 1\n"
      "adjust = world_size * batch_size * model_ema_steps / epochs\n"
      "alpha = min(1.0, (1.0 - model_ema_decay) * adjust)\n"
      "model_ema = ExponentialMovingAverage(model, device='cpu', decay=1.0 - alpha)\n"
      "for step in range(1, 101):\n"
      "    epoch, i = divmod(step - 1, 20)\n"
      "    load('s%d.' % step)\n"
      "    if i % model_ema_steps == 0:\n"
      "        model_ema.update_parameters(model)\n"
      "        if epoch < lr_warmup_epochs:\n"
      "            model_ema.n_averaged.fill_(0)\n"
      "ref = model_ema.module.state_dict()\n"
      "result = {'n_averaged': int(model_ema.n_averaged)}\n"
      "for label, path, prefix in (('checkpoint', '" + ckpt + "', 'ema.'), ('export', '" +
      (d / "ema/model_ema.safetensors") + "', '')):\n"
      "    T, meta = reader(path)\n"
      "    worst, exact = 0.0, True\n"
      "    for name in names:\n"
      "        mine = T(prefix + name)\n"
      "        assert mine.dtype == ref[name].dtype, (name, mine.dtype, ref[name].dtype)\n"
      "        worst = max(worst, (mine.double() - ref[name].double()).abs().max().item())\n"
      "        exact = exact and torch.equal(mine, ref[name])\n"
      "    result[label] = {'max_diff': worst, 'exact': exact}\n"
      "    result[label + '_n_averaged'] = meta.get('ema.n_averaged')\n"
      "ts = torch.jit.load('" + (d / "ema/model_ema.ts.pt") + "').state_dict()\n"
      "result['torchscript_exact'] = all(torch.equal(ts[k], ref[k]) for k in names)\n"
      "last = steps('s100.fc.weight')\n"
      "result['moved'] = (ref['fc.weight'] - last).abs().max().item()\n"
      "print(json.dumps(result))\n");
  const json r = json::parse(out);
  for (const char* where : {"checkpoint", "export"}) {
    EXPECT_LE(r[where]["max_diff"].get<double>(), 1e-6) << where;
    EXPECT_TRUE(r[where]["exact"].get<bool>()) << where << ": max difference " << r[where]["max_diff"];
  }
  EXPECT_TRUE(r["torchscript_exact"].get<bool>());  // model_ema.ts.pt holds the EMA too
  EXPECT_EQ(r["checkpoint_n_averaged"], std::to_string(r["n_averaged"].get<int64_t>()));
  EXPECT_GT(r["moved"].get<double>(), 1e-4);  // the average is not simply the last weights
  std::printf("100 training steps: EMA (checkpoint, model_ema.safetensors) vs AveragedModel fed the same weights: max "
              "|difference| %g / %g; EMA differs from the last weights by up to %g\n",
              r["checkpoint"]["max_diff"].get<double>(), r["export"]["max_diff"].get<double>(),
              r["moved"].get<double>());

  // Evaluated beside the model after every epoch: metrics, summary.json.
  const json summary = json::parse(test::read_text(d / "ema/summary.json"));
  for (const char* k : {"test_acc_ema", "test_loss_ema", "test_top5_ema", "ema_sha256", "ema_decay"}) {
    EXPECT_TRUE(summary.contains(k)) << k;
  }
  EXPECT_DOUBLE_EQ(summary["ema_decay"].get<double>(), 1.0 - 0.01 * 32 * 3 / 5);
  EXPECT_NE(summary["ema_sha256"], summary["params_sha256"]);
  std::istringstream metrics(test::read_text(d / "ema/metrics.jsonl"));
  int evals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const json rec = json::parse(line);
    if (rec["type"] != "eval") continue;
    ++evals;
    EXPECT_TRUE(rec.contains("test_acc_ema") && rec.contains("test_loss_ema")) << line;
  }
  EXPECT_EQ(evals, 5);
}

// Stops training at `step` as Ctrl-C does (request_stop: a checkpoint, no evaluation).
class StopAt final : public StepObserver {
 public:
  explicit StopAt(int64_t step) : step_(step) {}
  void after_update(const StepEvent& e) override {
    if (e.step == step_) request_stop();
  }
  std::string describe() const override { return "stop"; }

 private:
  int64_t step_;
};

// Law 1, law 5: the EMA (its tensors and n_averaged, mid-average) is in every checkpoint, so a
// run resumed from a mid-epoch one ends with the uninterrupted run's weights and EMA. And the
// EMA changes nothing of the model's own run (M1: it is evaluated through the Evaluator's eval
// guard, in the model's place, which gets its own weights back after).
TEST(EmaTraining, ResumedFromAMidEpochCheckpointEqualsTheUninterruptedRun) {
  test::TempDir d;
  auto job = [&d](const std::string& name) {
    JobConfig j;
    j.run.dir = d.path();
    j.run.name = name;
    j.data.train_samples = 1280;  // 10 steps of 128 an epoch, 3 epochs
    j.data.test_samples = 500;
    j.train.batch_size = 128;
    j.train.epochs = 3;
    j.train.precision = PrecisionMode::kFp32;
    j.schedule.name = "cosine";
    j.schedule.warmup_epochs = 1;
    j.log.progress = "none";
    j.pieces.of<EmaOptions>(kEmaPiece) = {true, 0.999, 3, true};
    return j;
  };
  const TrainSummary whole = Trainer(job("whole")).run();
  ASSERT_EQ(whole.steps, 30);
  {  // The EMA leaves the training alone: its evaluations swap its weights in and back bit for bit.
    JobConfig plain = job("plain");
    plain.pieces.of<EmaOptions>(kEmaPiece).enabled = false;
    const TrainSummary p = Trainer(plain).run();
    EXPECT_EQ(p.params_sha256, whole.params_sha256);
    EXPECT_EQ(p.test_acc, whole.test_acc);
    EXPECT_EQ(p.test_loss, whole.test_loss);
  }

  constexpr int64_t kStop = 17;  // epoch 1 (after the warm-up), batch 7: EMA updates at batches 0, 3, 6
  testing::set_extra_step_observer([stop = kStop](const Job&) { return std::make_unique<StopAt>(stop); });
  try {
    Trainer(job("stopped")).run();
    ADD_FAILURE() << "expected the run to stop at step " << kStop;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted at step 17"), std::string::npos) << e.what();
  }
  testing::set_extra_step_observer(nullptr);
  const CheckpointData ckpt = read_checkpoint(d / "stopped/checkpoints/ckpt-000000017.safetensors");
  EXPECT_EQ(ckpt.meta.at("ema.n_averaged"), "3");  // copied at batch 0, averaged at 3 and 6
  EXPECT_NE(ckpt.find("ema.bn1.running_mean"), nullptr);
  EXPECT_NE(ckpt.find("ema.bn1.num_batches_tracked"), nullptr);

  const TrainSummary resumed = Trainer(job("stopped")).run();
  EXPECT_EQ(resumed.steps, 30);
  EXPECT_EQ(resumed.params_sha256, whole.params_sha256);
  const json want = json::parse(test::read_text(d / "whole/summary.json"));
  const json got = json::parse(test::read_text(d / "stopped/summary.json"));
  EXPECT_EQ(got["resumed_from_step"], kStop);
  EXPECT_EQ(got["ema_sha256"], want["ema_sha256"]);
  EXPECT_EQ(got["test_acc_ema"], want["test_acc_ema"]);
  EXPECT_EQ(got["test_loss_ema"], want["test_loss_ema"]);
  EXPECT_NE(want["ema_sha256"], want["params_sha256"]);
}

}  // namespace
}  // namespace crucible::train
