// libFuzzer target: torch.save zip + restricted unpickler.
#include "crucible/io/pt.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] {
    auto pt = crucible::io::parse_pt(data, size, "fuzz.pt", nullptr);
    for (const auto& t : pt.tensors) (void)t.array.c_order_bytes();
  });
}
