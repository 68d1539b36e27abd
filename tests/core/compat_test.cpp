// compat: the autocast guard enables bf16 mixed precision for its scope and restores the
// state after (nested too); the CPU generator state round-trips (what checkpoints rely on).
#include "crucible/core/compat.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
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

TEST(Compat, VersionIsKnown) { EXPECT_FALSE(torch_version().empty()); }

}  // namespace
}  // namespace crucible::compat
