// libFuzzer target: IDX, plain and gzip-compressed.
#include "crucible/io/idx.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] { (void)crucible::io::parse_idx(data, size, "fuzz.idx"); });
}
