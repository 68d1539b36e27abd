// `crucible launch` and `crucible sampler`: argument wiring over the dist and data layers
// (dist/launch.h, data/samplers/sampler.h), which hold the logic. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/distributed/launch.h"

namespace CLI {
class App;
}

namespace crucible::cli {

struct SamplerArgs {
  int64_t n = 0, world = 1, rank = 0, epoch = 0;
  uint64_t seed = 0;
  bool shuffle = false, drop_last = false, json = false;
};

// `crucible launch [--nproc N ...] -- CMD ARGS…`: everything after `--` is the command, untouched.
CLI::App* add_launch(CLI::App& app, distributed::LaunchOptions& options);
int run_launch(const distributed::LaunchOptions& options);

// `crucible sampler --n N --world W --rank R ...`: the indices one rank visits in an epoch (X1).
CLI::App* add_sampler(CLI::App& app, SamplerArgs& args);
int run_sampler(const SamplerArgs& args);

}  // namespace crucible::cli
