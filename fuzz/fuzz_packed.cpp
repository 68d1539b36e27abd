// libFuzzer target: crucible's packed index (index.crpk: magic, JSON header, 24-byte records).
// The input is the index; beside it in a private scratch folder lie two fixed shard files
// ("shard-00000.bin", 8 KiB, and an empty "shard-00001.bin") that records may point into.
// Every sample the index admits is read whole.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "crucible/data/formats/sample_source.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir scratch("fuzz_packed", {"index.crpk", "shard-00000.bin", "shard-00001.bin"});
  static const bool shards_written = [] {
    std::vector<uint8_t> shard(8192);
    for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<uint8_t>(i * 7 + 3);
    write_fuzz_file(scratch.path("shard-00000.bin"), shard.data(), shard.size());
    write_fuzz_file(scratch.path("shard-00001.bin"), nullptr, 0);
    return true;
  }();
  (void)shards_written;
  const std::string index = scratch.path("index.crpk");
  write_fuzz_file(index, data, size);
  return fuzz_one([&] {
    auto src = crucible::data::open_packed(index);
    uint64_t sum = 0;
    for (int64_t i = 0; i < src->size() && i < 256; ++i) {
      const auto e = src->get(i);
      for (size_t k = 0; k < e.size; ++k) sum += e.data[k];
    }
    (void)src->describe();
    if (sum == 0xffffffffffffffffull) std::abort();  // keeps the reads
  });
}
