// compat: the autocast guard enables bf16 mixed precision for its scope and restores the
// state after (nested too); the CPU generator state round-trips (what checkpoints rely on).
#include "crucible/core/compat.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cstdio>
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
