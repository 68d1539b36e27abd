// libFuzzer target: WebDataset tar shards — the tar walk that builds the sample index, and the
// "<shard>.idx" sidecar it writes and reads back. The input is written as a shard in a private
// scratch folder (the source maps files by path); every sample found is read whole. Invariant:
// a second open, which takes the sidecar the first one wrote, finds exactly the same samples.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crucible/data/formats/sample_source.h"
#include "fuzz_common.h"

namespace {

struct Seen {
  int64_t size = 0;
  uint64_t bytes = 0;
  uint64_t hash = 1469598103934665603ull;
};

Seen read_all(const crucible::data::SampleSource& src) {
  Seen s;
  s.size = src.size();
  for (int64_t i = 0; i < src.size() && i < 256; ++i) {
    const auto e = src.get(i);
    s.bytes += e.size;
    for (size_t k = 0; k < e.size; ++k) s.hash = (s.hash ^ e.data[k]) * 1099511628211ull;
    s.hash = (s.hash ^ static_cast<uint64_t>(e.label + 1)) * 1099511628211ull;
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir scratch("fuzz_tar", {"shard.tar", "shard.tar.idx"});
  const std::string shard = scratch.path("shard.tar");
  std::remove((shard + ".idx").c_str());
  write_fuzz_file(shard, data, size);
  return fuzz_one([&] {
    const Seen first = read_all(*crucible::data::open_tar_shards({shard}));
    const Seen again = read_all(*crucible::data::open_tar_shards({shard}));  // from the sidecar
    if (first.size != again.size || first.bytes != again.bytes || first.hash != again.hash) {
      std::fprintf(stderr, "tar index read back differs from the one built: %lld vs %lld samples\n",
                   static_cast<long long>(first.size), static_cast<long long>(again.size));
      std::abort();
    }
  });
}
