// cpuinfo_has_native_bf16: the flags that mean bf16 arithmetic in hardware, on x86 and Arm, and
// their absence (an AVX2-only EPYC: `precision = "auto"` trains in fp32 there).
#include "crucible/core/memory.h"

#include <gtest/gtest.h>

namespace crucible {
namespace {

TEST(Memory, Bf16HardwareIsReadFromCpuinfoFlags) {
  std::string flag = "x";
  EXPECT_FALSE(cpuinfo_has_native_bf16("processor : 0\nflags : fpu sse2 avx avx2 fma\n", &flag));
  EXPECT_EQ(flag, "");
  EXPECT_FALSE(cpuinfo_has_native_bf16("flags : avx512f avx512bw avx512_vnni\n"));  // AVX-512 without bf16
  EXPECT_TRUE(cpuinfo_has_native_bf16("processor : 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n", &flag));
  EXPECT_EQ(flag, "avx512_bf16");
  EXPECT_TRUE(cpuinfo_has_native_bf16("flags : amx_bf16 amx_tile\n", &flag));
  EXPECT_EQ(flag, "amx_bf16");
  EXPECT_TRUE(cpuinfo_has_native_bf16("processor : 0\nFeatures : fp asimd sve bf16 i8mm\n", &flag));  // Arm
  EXPECT_EQ(flag, "bf16");
  EXPECT_FALSE(cpuinfo_has_native_bf16("model name : bf16 avx512_bf16 marketing\n"));  // not a flags line
  EXPECT_FALSE(cpuinfo_has_native_bf16(""));
  (void)cpu_has_native_bf16();  // this machine's answer, whatever it is, reads without throwing
}

}  // namespace
}  // namespace crucible
