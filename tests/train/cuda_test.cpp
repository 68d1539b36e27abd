// CUDA-labelled tests (ctest -L cuda; scripts/device-check runs them on the GPU machine):
// names end in _CUDA and skip where libtorch sees no GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "crucible/core/compat.h"
#include "crucible/data/device_input.h"
#include "crucible/train/trainer.h"
#include "test_util.h"

namespace crucible::train {
namespace {

bool have_cuda() { return compat::cuda_device_count() > 0; }

// The default job on the GPU for a few steps, in bf16 and in fp16 (with the loss scaler),
// data through pinned memory (D9): it runs, stays finite and learns.
TEST(Trainer, ShortRunsOnTheGpu_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible to libtorch " << compat::torch_version();
  for (const char* precision : {"bf16", "fp16"}) {
    test::TempDir d;
    JobConfig j;
    j.run.dir = d.path();
    j.train.device = "cuda";
    j.train.precision = precision;
    j.data.train_samples = 8192;
    j.train.epochs = 2;
    j.log.progress = "none";
    const TrainSummary s = Trainer(j).run();
    EXPECT_GT(s.test_acc, 0.7) << precision;
  }
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

}  // namespace
}  // namespace crucible::train
