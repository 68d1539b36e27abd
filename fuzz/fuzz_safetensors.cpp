// libFuzzer target: safetensors header and offsets.
#include "crucible/io/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] {
    auto f = crucible::io::SafetensorsFile::parse(data, size, "fuzz.safetensors", nullptr);
    for (const auto& e : f.entries()) (void)f.array(e).c_order_bytes();
  });
}
