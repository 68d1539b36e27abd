// `crucible bench loader` and `crucible pack`: argument wiring and reports over the data
// layer (data/data_setup.h, data/loader/loader.h, data/formats/pack.h), which holds the logic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crucible::cli {

struct BenchLoaderArgs {
  std::string data;   // "": the data the [data] keys name
  int64_t crop = 0;   // --crop (0: not given, data.crop's value holds)
  int threads = -1;   // --threads (-1: not given, data.threads's value holds; 0 = measured, D10)
  int64_t epochs = 1;
  int64_t batch_size = 256;
  int64_t warmup = -1;    // batches before timing starts (-1: 5% of an epoch, at least 2)
  int64_t split_at = -1;  // save the position after this many batches, rebuild, resume
  bool digest = false, json = false, eval = false;
  std::vector<std::string> overrides;
};

struct PackArgs {
  std::string src, dst;
  bool reencode = false, raw = false, validate = false, lmdb = false;
  int max_side = 0, quality = 90, threads = 0;
  double shard_mb = 1024;
  int64_t align = 4096;
  std::vector<std::string> overrides;  // --set data.KEY=VALUE: how the source is opened
};

struct BenchDecodeArgs {
  std::string data;
  int threads = 1;
  int64_t limit = 0;  // decode at most this many samples (0 = all)
  bool json = false;
};

CLI::App* add_bench_loader(CLI::App& bench, BenchLoaderArgs& args);
CLI::App* add_bench_decode(CLI::App& bench, BenchDecodeArgs& args);
int run_bench_decode(const BenchDecodeArgs& args);
CLI::App* add_pack(CLI::App& app, PackArgs& args);

int run_bench_loader(const BenchLoaderArgs& args);
int run_pack(const PackArgs& args);

}  // namespace crucible::cli
