// `crucible inspect` and `crucible convert`: argument wiring and output formatting over the
// io layer (io/tensor_file.h), which holds all the logic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crucible::cli {

struct IoArgs {
  std::string input, output;
  std::string dtype, shape;  // raw input
  std::string name;          // convert: pick one array
  bool json = false, stats = false, compress = false;
  std::string delimiter, comments = "#", usecols, fmt = "%.18e";
  int64_t skip_rows = 0;
  uint64_t memory_budget_mb = 0;  // 0: io's default, half the physical memory
};

// Registers the subcommands on `app`; the returned pointers tell which one was parsed.
CLI::App* add_inspect(CLI::App& app, IoArgs& args);
CLI::App* add_convert(CLI::App& app, IoArgs& args);

int run_inspect(const IoArgs& args);
int run_convert(const IoArgs& args);

}  // namespace crucible::cli
