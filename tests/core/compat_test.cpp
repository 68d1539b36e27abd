// compat: the autocast guard enables bf16 mixed precision for its scope and restores the
// state after (nested too); the CPU generator state round-trips (what checkpoints rely on).
#include "crucible/core/compat.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <gtest/gtest.h>

namespace crucible::compat {
namespace {

TEST(Compat, AutocastGuardScopesBf16) {
  at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    AutocastGuard g(c10::DeviceType::CPU, c10::ScalarType::BFloat16, true);
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastGuard off(c10::DeviceType::CPU, c10::ScalarType::BFloat16, false);
      EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);  // disabled guard changes nothing
    }
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
}

TEST(Compat, GeneratorStateRoundTrips) {
  seed_cpu_generator(11);
  at::Tensor s = cpu_generator_state();
  at::Tensor a = at::rand({5});
  set_cpu_generator_state(s);
  at::Tensor b = at::rand({5});
  EXPECT_TRUE(at::equal(a, b));
}

// The GPU's generator goes through the same device-generic call as the CPU's (checkpoints keep
// both; the CUDA variant of this test is in train/cuda_test.cpp).
TEST(Compat, DeviceGeneratorStateRoundTripsOnTheCpu) {
  const c10::Device cpu(c10::DeviceType::CPU);
  seed_cpu_generator(5);
  const at::Tensor s = generator_state(cpu);
  EXPECT_TRUE(at::equal(s, cpu_generator_state()));
  const at::Tensor a = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  set_generator_state(cpu, s);
  const at::Tensor b = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  EXPECT_TRUE(at::equal(a, b));
  const at::Tensor c = at::dropout(at::ones({64}), 0.5, /*train=*/true);
  EXPECT_FALSE(at::equal(b, c));  // the control: the stream moved on
  seed_device_generator(cpu, 1);  // no-op on the CPU (seed_cpu_generator owns it)
  EXPECT_TRUE(at::equal(generator_state(cpu), cpu_generator_state()));
}

// M6: deterministic mode pins cuBLAS's workspace (read when its first handle is made), keeps a
// deterministic value the user chose, and replaces one that is not.
TEST(Compat, DeterministicModeSetsTheCublasWorkspaceM6) {
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  EXPECT_EQ(set_deterministic(false), "");
  EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_EQ(set_deterministic(true), "CUBLAS_WORKSPACE_CONFIG=:4096:8");
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  EXPECT_EQ(set_deterministic(true), "");
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0", 1);
  EXPECT_NE(set_deterministic(true).find("was \":0:0\""), std::string::npos);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  set_deterministic(false);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
}

// T14: sync debug sets CUDA_LAUNCH_BLOCKING and turns torch's runtime sync-debug switch on
// (read back from torch's own state); a build without CUDA says the switch is unavailable.
TEST(Compat, SyncDebugTurnsTorchsSwitchOnT14) {
  ::unsetenv("CUDA_LAUNCH_BLOCKING");
  set_sync_debug_mode("off");  // another test in this process (a real run with sync_debug) may have set it
  EXPECT_EQ(sync_debug_mode(), built_with_cuda() ? "off" : "unavailable");
  enable_sync_debug();
  ASSERT_NE(std::getenv("CUDA_LAUNCH_BLOCKING"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_LAUNCH_BLOCKING"), "1");
  EXPECT_EQ(sync_debug_mode(), built_with_cuda() ? "warn" : "unavailable");
  set_sync_debug_mode("error");
  EXPECT_EQ(sync_debug_mode(), built_with_cuda() ? "error" : "unavailable");
  set_sync_debug_mode("off");
  EXPECT_EQ(sync_debug_mode(), built_with_cuda() ? "off" : "unavailable");
  EXPECT_THROW(set_sync_debug_mode("loud"), std::exception);
  std::printf("built with CUDA: %s; libtorch %s\n", built_with_cuda() ? "yes" : "no", torch_version().c_str());
}

// The version compat reports is the libtorch CMake found (its TorchConfigVersion.cmake, a
// source independent of the headers' macro), as major.minor.patch.
TEST(Compat, VersionIsTheOneBuiltAgainst) {
  const std::string v = torch_version();
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(std::sscanf(v.c_str(), "%d.%d.%d", &major, &minor, &patch), 3) << v;
  EXPECT_GE(major, 1);
  int cmake_major = -1, cmake_minor = -1;
  ASSERT_EQ(std::sscanf(CRUCIBLE_TORCH_CMAKE_VERSION, "%d.%d", &cmake_major, &cmake_minor), 2);
  EXPECT_EQ(major, cmake_major) << "compat says " << v << ", CMake found " << CRUCIBLE_TORCH_CMAKE_VERSION;
  EXPECT_EQ(minor, cmake_minor) << "compat says " << v << ", CMake found " << CRUCIBLE_TORCH_CMAKE_VERSION;
  EXPECT_EQ(major, TORCH_VERSION_MAJOR);
  EXPECT_EQ(minor, TORCH_VERSION_MINOR);
}

}  // namespace
}  // namespace crucible::compat
