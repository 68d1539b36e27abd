// CUDA-labelled tests (ctest -L cuda; scripts/device-check runs them on the GPU machine):
// names end in _CUDA and skip where libtorch sees no GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "crucible/core/compat.h"
#include "crucible/data/device_input.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/trainer.h"
#include "test_util.h"

namespace crucible::train {
namespace {

bool have_cuda() { return compat::cuda_device_count() > 0; }

// The default job on the first GPU, on a subset, quietly.
JobConfig gpu_job(const std::string& dir, int64_t train_samples, int64_t epochs) {
  JobConfig j;
  j.run.dir = dir;
  j.train.device = "cuda";
  j.data.train_samples = train_samples;
  j.train.epochs = epochs;
  j.log.progress = "none";
  return j;
}

// The default job on the GPU for a few steps, in bf16 and in fp16 (with the loss scaler),
// data through pinned memory (D9): it runs, stays finite and learns.
TEST(Trainer, ShortRunsOnTheGpu_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible to libtorch " << compat::torch_version();
  for (PrecisionMode precision : {PrecisionMode::kBf16, PrecisionMode::kFp16}) {
    test::TempDir d;
    JobConfig j = gpu_job(d.path(), 8192, 2);
    j.train.precision = precision;
    const TrainSummary s = Trainer(j).run();
    EXPECT_GT(s.test_acc, 0.7) << s.precision.value.to_string();
  }
}

// precision = "auto" on a GPU: the choice is the candidate with the smallest time it measured
// (a whole training step of each), and the steps then ran in it.
TEST(Trainer, AutoPrecisionOnTheGpuPicksTheFastestItTimed_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  test::TempDir d;
  JobConfig j = gpu_job(d.path(), 8192, 1);
  j.train.precision = PrecisionMode::kAuto;
  j.train.max_steps = 2;
  const TrainSummary s = Trainer(j).run();
  const PrecisionChoice& c = s.precision;
  EXPECT_EQ(c.source, "auto");
  ASSERT_GE(c.timed.size(), 2u);
  const PrecisionTiming* fastest = &c.timed[0];
  for (const auto& t : c.timed) {
    EXPECT_GT(t.ms, 0) << t.precision.to_string();
    if (t.ms < fastest->ms) fastest = &t;
  }
  EXPECT_EQ(c.value, fastest->precision);
  EXPECT_EQ(s.step_dtype, c.value.dtype == ComputeDtype::kBf16 ? "BFloat16" : "Float");
}

// T13: memory freed by tensors stays cached by the allocator until release_cached_memory
// gives it back (measured through the allocator's own statistics).
TEST(Compat, AutocastAndCacheReleaseOnTheGpu_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  at::Tensor a = at::randn({64, 64}, at::TensorOptions().device(dev));
  {
    compat::AutocastGuard g(c10::DeviceType::CUDA, c10::ScalarType::Half, true);
    EXPECT_EQ(at::mm(a, a).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(at::mm(a, a).scalar_type(), at::kFloat);
  compat::release_cached_memory(dev);
  const int64_t before = compat::cached_memory_bytes(dev);
  {
    at::Tensor big = at::empty({int64_t{256} << 20}, at::TensorOptions().dtype(at::kByte).device(dev));
    big.fill_(1);
  }  // freed: the allocator keeps the block
  EXPECT_GE(compat::cached_memory_bytes(dev) - before, int64_t{256} << 20);
  compat::release_cached_memory(dev);
  EXPECT_LT(compat::cached_memory_bytes(dev), int64_t{256} << 20);
  EXPECT_LE(compat::cached_memory_bytes(dev), before);
}

// D9: on a GPU the loader's batches live in pinned host memory (so the host-to-device copies
// are asynchronous), and DeviceInput's images and labels land on the device. On CPU the
// allocator is null (the loader's recycled heap buffers).
TEST(DeviceInput, BatchesArePinnedForTheGpuD9_CUDA) {
  EXPECT_FALSE(data::DeviceInput::batch_allocator(c10::Device(c10::DeviceType::CPU)));
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  auto allocate = data::DeviceInput::batch_allocator(dev);
  ASSERT_TRUE(allocate);
  data::PixelBuffer buf = allocate(size_t{4} * 28 * 28);
  const at::Tensor host = at::from_blob(buf.data(), {4 * 28 * 28}, at::kByte);
  EXPECT_TRUE(host.is_pinned()) << "batch memory is pageable: every copy would synchronise";
  EXPECT_FALSE(at::empty({16}, at::kByte).is_pinned());  // the control: plain heap memory is not
}

// D9: both copies of a batch (pixels and labels) leave the host without waiting for the GPU.
// Under torch's sync-debug switch set to "error", any synchronising call raises; the control
// is a plain blocking copy from pageable memory, which does raise.
TEST(DeviceInput, CopiesNeverWaitForTheGpuD9_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  data::Batch b;
  b.spec = data::ImageSpec{28, 28, 1, data::ColorOrder::kGray, data::ValueRange::kByte};
  b.pixels = data::DeviceInput::batch_allocator(dev)(size_t{4} * 28 * 28);
  for (size_t i = 0; i < b.pixels.size(); ++i) b.pixels.data()[i] = static_cast<uint8_t>(i);
  b.labels = {1, 2, 3, 4};
  b.sample_ids = {0, 1, 2, 3};
  data::DeviceInput in(b.spec, {{0.5}, {0.25}, data::ValueRange::kUnit}, dev, false);
  at::Tensor x, y;
  compat::set_sync_debug_mode("error");
  EXPECT_NO_THROW({
    x = in.images(b);
    y = in.labels(b);
  });
  EXPECT_ANY_THROW((void)at::arange(4).to(dev, /*non_blocking=*/false, /*copy=*/true).sum().item<int64_t>())
      << "the control: sync-debug mode did not catch a synchronising call";
  compat::set_sync_debug_mode("off");
  ASSERT_TRUE(y.is_cuda());
  EXPECT_TRUE(at::equal(y.cpu(), at::tensor(std::vector<int64_t>{1, 2, 3, 4})));
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{4, 1, 28, 28}));
}

// The GPU's generator (dropout on the GPU) round-trips through its state, which checkpoints of
// GPU runs keep as rng.torch_cuda; a resumed run continues the same dropout stream.
TEST(Compat, GpuGeneratorStateRoundTrips_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  compat::seed_device_generator(dev, 3);
  const at::Tensor s = compat::generator_state(dev);
  const at::Tensor ones = at::ones({4096}, at::TensorOptions().device(dev));
  const at::Tensor a = at::dropout(ones, 0.5, true);
  compat::set_generator_state(dev, s);
  const at::Tensor b = at::dropout(ones, 0.5, true);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(b, at::dropout(ones, 0.5, true)));
}

TEST(Trainer, GpuCheckpointKeepsTheDropoutGenerator_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  test::TempDir d;
  JobConfig j = gpu_job(d.path(), 2048, 1);
  j.train.deterministic = true;
  Trainer(j).run();
  CheckpointManager m(d.path() + "/" + j.run.name + "/checkpoints", 3);
  std::string path;
  const auto ckpt = m.load_latest(&path);
  ASSERT_TRUE(ckpt.has_value());
  const at::Tensor* rng = ckpt->find("rng.torch_cuda");
  ASSERT_NE(rng, nullptr) << path << " has no GPU generator state";
  EXPECT_TRUE(at::equal(*rng, compat::generator_state(c10::Device(c10::DeviceType::CUDA, 0))))
      << "the saved state is not the generator's state at the end of the run";
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);  // M6: set before the first product
}

}  // namespace
}  // namespace crucible::train
