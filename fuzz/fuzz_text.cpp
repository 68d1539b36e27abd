// libFuzzer target: delimited text (loadtxt), whitespace and comma.
#include "crucible/io/text.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_one([&] {
    crucible::io::TextOptions o;
    if (size > 0 && data[0] == ';') o.delimiter = ";";
    (void)crucible::io::parse_text(reinterpret_cast<const char*>(data), size, "fuzz.txt", o);
  });
}
