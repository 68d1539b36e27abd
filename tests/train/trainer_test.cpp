// The Trainer in-process: an injected out-of-memory at step k is survived by splitting the
// batch (T16, D5) — the run completes, the log names the step and the split, and the result is
// close to an unfaulted run; precision "auto" picks the fastest candidate it timed; a step
// observer gets the whole contract of its seam, across a resume.
#include "crucible/train/environment.h"
#include "crucible/train/trainer.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/config.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/data/samplers/repeated_sampler.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/job.h"
#include "crucible/train/recipe.h"
#include "crucible/train/run_state.h"
#include "test_util.h"

namespace crucible::train {
namespace {

JobConfig small_job(const std::string& dir, const std::string& name) {
  JobConfig j;
  j.run.dir = dir;
  j.run.name = name;
  j.data.train_samples = 8192;
  j.train.epochs = 2;
  j.log.progress = "none";
  return j;
}

// T14, M6: train.sync_debug and train.deterministic reach the process before the device starts
// (the CUDA driver and cuBLAS read their variables once) and turn torch's own switches on.
TEST(Trainer, SyncDebugAndDeterminismReachTorchT14M6) {
  ::unsetenv("CUDA_LAUNCH_BLOCKING");
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  test::TempDir d;
  JobConfig j = small_job(d.path(), "debug");
  j.data.train_samples = 2560;  // 10 steps of 256
  j.data.test_samples = 256;
  j.train.epochs = 1;
  j.train.sync_debug = true;
  j.train.deterministic = true;
  const TrainSummary s = Trainer(j).run();
  EXPECT_GT(s.steps, 0);
  ASSERT_NE(std::getenv("CUDA_LAUNCH_BLOCKING"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_LAUNCH_BLOCKING"), "1");
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_EQ(compat::sync_debug_mode(), compat::built_with_cuda() ? "warn" : "unavailable");
}

// A step observer that counts what the seam promises (issue 25): every update, the gradients of
// the steps it asks for, its count kept in every checkpoint, a figure added to every evaluation
// — and the Evaluator it is handed evaluates the job's model as the Trainer just did.
struct ObserverRecord {
  int64_t updates = 0;         // the observer's state (checkpointed)
  int64_t gradient_calls = 0;  // steps whose gradients it was handed
  bool gradients_defined = true;
  bool same_evaluation = true;
};

class CountingObserver final : public StepObserver {
 public:
  explicit CountingObserver(std::shared_ptr<ObserverRecord> r) : r_(std::move(r)) {}
  bool wants_gradients(int64_t next_step) const override { return next_step % 3 == 0; }
  void gradients(const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) override {
    ++r_->gradient_calls;
    for (const auto& g : grads) r_->gradients_defined = r_->gradients_defined && g.defined();
  }
  void after_update(const StepEvent& e) override {
    ++r_->updates;
    EXPECT_EQ(e.step, r_->updates);  // told once per update, after it
  }
  void checkpoint_fields(CheckpointIO& io) override { io.value("test_observer.updates", r_->updates); }
  EvalFigures after_evaluation(int64_t step, const EvalResult& result, Evaluator& evaluator) override {
    const EvalResult again = evaluator.run(evaluator.model());
    r_->same_evaluation = r_->same_evaluation && again.acc == result.acc && again.loss == result.loss;
    return {{"observer_updates", static_cast<double>(r_->updates)}};
  }
  std::string describe() const override { return "counting"; }

 private:
  std::shared_ptr<ObserverRecord> r_;
};

TEST(Trainer, StepObserversSeeEveryUpdateKeepTheirStateAcrossAResumeAndAddEvalFigures) {
  test::TempDir d;
  auto record = std::make_shared<ObserverRecord>();
  testing::set_extra_step_observer([record](const Job&) { return std::make_unique<CountingObserver>(record); });
  JobConfig j = small_job(d.path(), "observed");
  j.data.train_samples = 2560;  // 10 steps of 256 an epoch, 2 epochs
  j.data.test_samples = 512;
  j.train.max_steps = 7;  // stops inside the first epoch: evaluates and checkpoints at step 7
  Trainer(j).run();
  EXPECT_EQ(record->updates, 7);
  record->updates = 0;  // the resumed run's observer must take its count from the checkpoint
  j.train.max_steps = 0;
  const TrainSummary s = Trainer(j).run();
  testing::set_extra_step_observer(nullptr);
  EXPECT_EQ(s.steps, 20);
  EXPECT_EQ(record->updates, 20);
  EXPECT_EQ(record->gradient_calls, 6);  // before the updates of steps 3, 6 | 9, 12, 15, 18
  EXPECT_TRUE(record->gradients_defined);
  EXPECT_TRUE(record->same_evaluation);
  const nlohmann::json summary = nlohmann::json::parse(test::read_text(d / "observed/summary.json"));
  EXPECT_EQ(summary["observer_updates"].get<double>(), 20.0);
  std::istringstream metrics(test::read_text(d / "observed/metrics.jsonl"));
  std::vector<int64_t> evaluated;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r["type"] != "eval") continue;
    evaluated.push_back(r["step"].get<int64_t>());
    EXPECT_EQ(r["observer_updates"].get<double>(), r["step"].get<double>()) << line;
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{7, 10, 20}));
}

// data.sampler = "repeated" end to end (X1): an epoch is RASampler's floor(n // 256 * 256 /
// world) samples — 2600 give 2560, 10 steps of 256 where the DistributedSampler would take 11 —
// its batches are the sampler's order for the job's stream (runs of data.repeats copies of one
// sample), a resume in mid-epoch starts at the right batch, and a run stopped at step 7 and
// resumed ends after 2 × 10 steps with its evaluations at the epoch ends.
TEST(Trainer, RepeatedSamplerTrainsRASamplerEpochsAndResumesX1) {
  test::TempDir d;
  JobConfig j = small_job(d.path(), "repeated");
  j.data.sampler = "repeated";
  j.data.train_samples = 2600;
  j.data.test_samples = 256;
  {
    auto job = join_job(j);
    assemble_job(*job, {});
    EXPECT_EQ(job->steps_per_epoch, 10);
    EXPECT_EQ(job->total_steps, 20);
    const data::RepeatedAugmentationSampler reference(2600, true, derive_seed(j.run.seed, RngStream::kSampler), 3, {});
    EXPECT_EQ(job->train_loader->sampler().describe(), reference.describe());
    const std::vector<int64_t> order = reference.epoch_order(1);
    ASSERT_EQ(order.size(), 2560u);
    std::vector<int64_t> seen;
    job->train_loader->start_epoch(1);
    while (auto b = job->train_loader->next()) seen.insert(seen.end(), b->sample_ids.begin(), b->sample_ids.end());
    EXPECT_EQ(seen, order);
    for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], seen[k - k % 3]) << k;  // runs of 3 copies
    job->train_loader->start_epoch(1, /*first_batch=*/7);  // where a resume at batch 7 continues
    const auto b = job->train_loader->next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->index, 7);
    EXPECT_EQ(b->sample_ids, std::vector<int64_t>(order.begin() + 7 * 256, order.begin() + 8 * 256));
  }
  j.train.max_steps = 7;  // stops inside the first epoch
  EXPECT_EQ(Trainer(j).run().steps, 7);
  j.train.max_steps = 0;
  EXPECT_EQ(Trainer(j).run().steps, 20);
  std::istringstream metrics(test::read_text(d / "repeated/metrics.jsonl"));
  std::vector<int64_t> evaluated;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r["type"] == "eval") evaluated.push_back(r["step"].get<int64_t>());
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{7, 10, 20}));
}

TEST(Trainer, SurvivesAnInjectedOutOfMemoryT16) {
  test::TempDir d;
  const TrainSummary plain = Trainer(small_job(d.path(), "plain")).run();
  testing::inject_oom(/*step=*/5, /*max_micro_batch=*/64);
  ::testing::internal::CaptureStderr();
  const TrainSummary faulted = Trainer(small_job(d.path(), "faulted")).run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  testing::inject_oom(-1, 0);
  EXPECT_NE(err.find("step 5: out of memory with micro-batches of 256 samples"), std::string::npos) << err;
  EXPECT_NE(err.find("as 2 micro-batches"), std::string::npos) << err;
  EXPECT_NE(err.find("as 4 micro-batches of about 64"), std::string::npos) << err;
  EXPECT_EQ(faulted.steps, plain.steps);
  EXPECT_NEAR(faulted.test_acc, plain.test_acc, 0.003);
  std::printf("test accuracy: unfaulted %.4f, OOM at step 5 %.4f\n", plain.test_acc, faulted.test_acc);
}

// T16 for a detector: an image whose boxes exhaust memory (injected at step 2: micro-batches of
// more than 2 images fail) is retried as smaller micro-batches — each image at its own size, its
// own boxes — and the run completes with every step, its COCO numbers finite, the retry counted.
TEST(Trainer, ADetectorSurvivesAnInjectedOutOfMemoryT16) {
  test::TempDir d;
  const std::string set = d / "set";
  const std::string cmd = fmt::format("{}/../../scripts/make-fashion-detection-set {} --train 24 --test 8 >/dev/null",
                                      CRUCIBLE_TEST_SUPPORT_DIR, set);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  JobConfig j;
  ConfigSchema schema;
  bind_job_config(j, schema);
  for (const std::string& o : {"run.dir=" + d.path(), std::string("run.name=det"), std::string("data.dataset=detection"),
                               "data.train_path=" + set + "/annotations/instances_train.json",
                               "data.test_path=" + set + "/annotations/instances_val.json",
                               std::string("model.name=fcos_resnet18_fpn"), std::string("model.min_size=64"),
                               std::string("model.max_size=96"), std::string("train.epochs=1"), std::string("schedule.name=constant"),
                               std::string("train.batch_size=8"), std::string("train.precision=fp32"),
                               std::string("log.progress=none")}) {
    schema.apply_override(o);
  }
  testing::inject_oom(/*step=*/2, /*max_micro_batch=*/2);
  ::testing::internal::CaptureStderr();
  const TrainSummary s = Trainer(j).run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  testing::inject_oom(-1, 0);
  EXPECT_NE(err.find("step 2: out of memory with micro-batches of 8 samples"), std::string::npos) << err;
  EXPECT_NE(err.find("as 4 micro-batches of about 2"), std::string::npos) << err;
  EXPECT_EQ(s.steps, 3);
  ASSERT_EQ(s.test_coco.size(), 12u);
  for (double v : s.test_coco) EXPECT_TRUE(std::isfinite(v)) << v;
  const nlohmann::json summary = nlohmann::json::parse(test::read_text(d / "det/summary.json"));
  EXPECT_EQ(summary["oom_retries"], 2);
}

TEST(Trainer, OneSampleThatDoesNotFitNamesTheSamples) {
  test::TempDir d;
  testing::inject_oom(/*step=*/2, /*max_micro_batch=*/0);
  ::testing::internal::CaptureStderr();
  try {
    Trainer(small_job(d.path(), "hopeless")).run();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("out of memory with a single sample (sample ids"), std::string::npos)
        << e.what();
  }
  ::testing::internal::GetCapturedStderr();
  testing::inject_oom(-1, 0);
}

// precision = "auto" on a CPU: a rule, not a timing — bf16 where the CPU computes bf16 in
// hardware, else fp32, channels_last as configured — and the training steps then ran in it (the
// logits' dtype and the weights' memory format observed in the step). A configured fp32 run is
// the control: its steps ran in float, contiguous. (On a GPU auto times candidates: cuda_test.)
TEST(Trainer, AutoPrecisionOnACpuFollowsItsBf16HardwareAndTrainsInIt) {
  test::TempDir d;
  JobConfig j = small_job(d.path(), "auto");
  j.train.precision = PrecisionMode::kAuto;
  j.train.max_steps = 2;
  ::testing::internal::CaptureStdout();
  const TrainSummary s = Trainer(j).run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  const PrecisionChoice& c = s.precision;
  EXPECT_EQ(c.source, "auto");
  EXPECT_TRUE(c.timed.empty());  // nothing timed on a CPU
  std::string flag;
  const bool native = cpu_has_native_bf16(&flag);
  EXPECT_EQ(c.value, (Precision{native ? ComputeDtype::kBf16 : ComputeDtype::kFp32, true}));
  EXPECT_EQ(s.step_dtype, native ? "BFloat16" : "Float");
  EXPECT_TRUE(s.step_channels_last);
  EXPECT_NE(out.find(native ? "computes bf16 in hardware (" + flag + ")" : "has no bf16 arithmetic"), std::string::npos)
      << out;
  std::printf("auto picked %s (native bf16: %s); steps ran in %s\n", c.value.to_string().c_str(),
              native ? flag.c_str() : "no", s.step_dtype.c_str());

  JobConfig f = small_job(d.path(), "fp32");
  f.train.precision = PrecisionMode::kFp32;
  f.train.channels_last = false;
  f.train.max_steps = 2;
  const TrainSummary fs = Trainer(f).run();
  EXPECT_EQ(fs.precision.source, "configured");
  EXPECT_TRUE(fs.precision.timed.empty());
  EXPECT_EQ(fs.step_dtype, "Float");
  EXPECT_FALSE(fs.step_channels_last);
  (void)out;
}

}  // namespace
}  // namespace crucible::train
