// libFuzzer target: .npy header and data parsing.
#include "crucible/io/npy.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] {
    crucible::io::Array a = crucible::io::parse_npy(data, size, "fuzz.npy", nullptr);
    (void)a.c_order_bytes();  // touch every element through the strides
  });
}
