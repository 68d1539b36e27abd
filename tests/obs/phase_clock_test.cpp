// PhaseClock: laps are contiguous (they add up to the time they span), a pause's time belongs
// to no phase, "off" measures nothing; on a GPU the device timeline is read without a sync per
// phase and adds up to the host's time once the device has finished.
#include "crucible/obs/phase_clock.h"

#include <ATen/ATen.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "crucible/core/compat.h"

namespace crucible::obs {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(PhaseClock, CpuLapsAddUpToTheTimeTheySpan) {
  PhaseClock clock(c10::Device(c10::kCPU), true);
  const auto t0 = Clock::now();
  clock.start();
  std::this_thread::sleep_for(milliseconds(30));
  clock.lap(Phase::kDataWait);
  std::this_thread::sleep_for(milliseconds(10));
  clock.lap(Phase::kForward);
  clock.lap(Phase::kBackward);  // an empty lap
  std::this_thread::sleep_for(milliseconds(10));
  clock.lap(Phase::kForward);  // the same phase twice adds
  const double spanned = since(t0);
  const PhaseSeconds p = clock.take();
  EXPECT_GE(p[Phase::kDataWait], 0.030);
  EXPECT_GE(p[Phase::kForward], 0.020);
  EXPECT_LT(p[Phase::kBackward], 0.005);
  EXPECT_LE(p.total(), spanned);
  EXPECT_NEAR(p.total(), spanned, 0.002);
  EXPECT_DOUBLE_EQ(clock.take().total(), 0);  // take() empties it
}

TEST(PhaseClock, APauseBelongsToNoPhaseAndOffMeasuresNothing) {
  PhaseClock clock(c10::Device(c10::kCPU), true);
  clock.start();
  clock.lap(Phase::kForward);
  clock.pause();
  std::this_thread::sleep_for(milliseconds(30));  // evaluation, a checkpoint
  clock.start();
  clock.lap(Phase::kOptimizer);
  EXPECT_LT(clock.take().total(), 0.010);

  PhaseClock off(c10::Device(c10::kCPU), false);
  EXPECT_FALSE(off.enabled());
  off.start();
  std::this_thread::sleep_for(milliseconds(5));
  off.lap(Phase::kForward);
  EXPECT_DOUBLE_EQ(off.take().total(), 0);
}

TEST(PhaseClock, DeviceTimelineAddsUpWithoutASyncPerPhase_CUDA) {
  if (compat::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const c10::Device gpu(c10::kCUDA, 0);
  PhaseClock clock(gpu, true);
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(gpu));
  at::Tensor b;
  const auto t0 = Clock::now();
  clock.start();
  for (int i = 0; i < 20; ++i) b = at::mm(a, a);
  clock.lap(Phase::kForward);
  const double queued = since(t0);  // the host only queued the work
  std::this_thread::sleep_for(milliseconds(50));
  clock.lap(Phase::kDataWait);
  b.sum().item<float>();
  clock.lap(Phase::kHostSync);
  const double spanned = since(t0);
  const PhaseSeconds p = clock.take();
  EXPECT_GT(p[Phase::kForward], queued) << "device time, not the host's launch time";
  EXPECT_NEAR(p.total(), spanned, 0.02 * spanned + 0.002);
}

}  // namespace
}  // namespace crucible::obs
