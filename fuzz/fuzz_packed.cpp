// libFuzzer target: crucible's packed index (index.crpk: magic, JSON header, 24-byte records).
// The input is the index; beside it in a private scratch folder lie two fixed shard files
// ("shard-00000.bin", 8 KiB, and an empty "shard-00001.bin") that records may point into.
// Every sample the index admits is read whole.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "crucible/data/sample_source.h"
#include "fuzz_common.h"

namespace {

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

std::string& dir() {
  static std::string d;
  return d;
}

const std::string& scratch() {
  static const std::string made = [] {
    char tmpl[] = "/tmp/fuzz_packed.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    dir() = tmpl;  // constructed before the handler is registered, so destroyed after it runs
    std::atexit([] {  // leave nothing behind in /tmp
      std::remove((dir() + "/index.crpk").c_str());
      std::remove((dir() + "/shard-00000.bin").c_str());
      std::remove((dir() + "/shard-00001.bin").c_str());
      ::rmdir(dir().c_str());
    });
    std::vector<uint8_t> shard(8192);
    for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<uint8_t>(i * 7 + 3);
    write(std::string(tmpl) + "/shard-00000.bin", shard);
    write(std::string(tmpl) + "/shard-00001.bin", {});
    return std::string(tmpl);
  }();
  return made;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string index = scratch() + "/index.crpk";
  write(index, std::vector<uint8_t>(data, data + size));
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
