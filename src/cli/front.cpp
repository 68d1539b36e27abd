// The `crucible` program, torch-free: inspect, convert, pack, bench, launch, sampler and report
// run here and start in milliseconds; train, eval, predict, tune and doctor need libtorch, whose loading alone costs
// about a second and 160 MB of resident memory, so for them this process exec's
// `crucible-torch` from its own folder with the same arguments (same pid, signals and exit
// code). Only main turns errors into exit codes (0 ok, 1 runtime failure, 2 bad input/usage).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "data_commands.h"
#include "distributed_commands.h"
#include "io_commands.h"
#include "report_command.h"

namespace {

using namespace crucible;

// The subcommands that crucible-torch runs, with their one-line help for `crucible --help`.
struct TorchCommand {
  const char* name;
  const char* help;
};
constexpr TorchCommand kTorchCommands[] = {
    {"train", "train a model (default: Fashion-MNIST, configs/fashion_mnist.toml)"},
    {"eval", "evaluate a checkpoint on the test set (under crucible launch: sharded, gathered, exact)"},
    {"predict", "write each test sample's top-K classes and probabilities to a .jsonl or .csv file"},
    {"tune", "find settings by measuring them (tune batch)"},
    {"doctor", "check the machine and the job before a long run (threads, memory, ulimit -n, bf16, CUDA, data)"},
    {"preview", "write a PNG grid of training samples as the model sees them (augmentations, MixUp/CutMix), labelled"},
};

std::string own_folder() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

// Replaces this process with crucible-torch; returns only on failure.
int exec_torch(int argc, char** argv) {
  const std::string path = own_folder() + "/crucible-torch";
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  log_error("cannot run {} ({}): `crucible {}` runs there; it is built beside crucible (cmake --build <build dir>)",
            path, std::strerror(errno), argv[1]);
  return 1;
}

int rank_from_env() {
  const char* r = std::getenv("RANK");
  return r != nullptr ? std::atoi(r) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    for (const auto& c : kTorchCommands) {
      if (std::strcmp(argv[1], c.name) == 0) return exec_torch(argc, argv);
    }
    if (argc > 2 && std::strcmp(argv[1], "bench") == 0 && std::strcmp(argv[2], "model") == 0) {
      return exec_torch(argc, argv);  // the model needs libtorch
    }
  }
  tune_host_allocator();
  set_log_rank(rank_from_env());

  CLI::App app{"crucible: a training engine on libtorch that makes the classic training pitfalls loud", "crucible"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("crucible ") + CRUCIBLE_VERSION);
  for (const auto& c : kTorchCommands) app.add_subcommand(c.name, c.help);  // reached only through exec_torch

  cli::IoArgs io_args;
  CLI::App* inspect_cmd = cli::add_inspect(app, io_args);
  CLI::App* convert_cmd = cli::add_convert(app, io_args);
  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks of crucible's parts, timed alone (X9)");
  bench_cmd->require_subcommand(1);
  cli::BenchLoaderArgs bench_loader_args;
  CLI::App* bench_loader_cmd = cli::add_bench_loader(*bench_cmd, bench_loader_args);
  bench_cmd->add_subcommand("model",
                            "time the job's model: forward and the training step in each precision and memory format, "
                            "median/p90 after warm-up, memory peak (runs in crucible-torch)");
  cli::BenchDecodeArgs bench_decode_args;
  CLI::App* bench_decode_cmd = cli::add_bench_decode(*bench_cmd, bench_decode_args);
  cli::PackArgs pack_args;
  CLI::App* pack_cmd = cli::add_pack(app, pack_args);
  distributed::LaunchOptions launch_options;
  CLI::App* launch_cmd = cli::add_launch(app, launch_options);
  cli::SamplerArgs sampler_args;
  CLI::App* sampler_cmd = cli::add_sampler(app, sampler_args);
  cli::ReportArgs report_args;
  CLI::App* report_cmd = cli::add_report(app, report_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  try {
    if (inspect_cmd->parsed()) return cli::run_inspect(io_args);
    if (convert_cmd->parsed()) return cli::run_convert(io_args);
    if (bench_loader_cmd->parsed()) return cli::run_bench_loader(bench_loader_args);
    if (pack_cmd->parsed()) return cli::run_pack(pack_args);
    if (bench_decode_cmd->parsed()) return cli::run_bench_decode(bench_decode_args);
    // Several nodes' launchers meet in a c10d store, which needs libtorch: crucible-torch runs them.
    if (launch_cmd->parsed()) return launch_options.nnodes > 1 ? exec_torch(argc, argv) : cli::run_launch(launch_options);
    if (sampler_cmd->parsed()) return cli::run_sampler(sampler_args);
    if (report_cmd->parsed()) return cli::run_report(report_args);
  } catch (const Error& e) {
    log_error("{}", e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    return 1;
  }
  return 0;
}
