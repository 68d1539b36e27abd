// CUDA-labelled tests (ctest -L cuda; scripts/device-check runs them on the GPU machine):
// names end in _CUDA and skip where libtorch sees no GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "crucible/core/compat.h"
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
}

}  // namespace
}  // namespace crucible::train
