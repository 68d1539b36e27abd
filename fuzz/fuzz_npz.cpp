// libFuzzer target: .npz (zip through libzip, then .npy members).
#include "crucible/io/npz.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] {
    for (const auto& a : crucible::io::parse_npz(data, size, "fuzz.npz")) (void)a.array.c_order_bytes();
  });
}
