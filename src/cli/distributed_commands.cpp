// launch / sampler.
#include "distributed_commands.h"

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/data/samplers/sampler.h"

namespace crucible::cli {

CLI::App* add_launch(CLI::App& app, distributed::LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "launch", "start the processes of a data-parallel job with the environment torchrun gives them (X10); "
                "when one fails the others are stopped and the failure is named");
  cmd->add_option("--nproc", o.nproc, "processes on this machine (one per device)")->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", o.nnodes, "machines in the job")->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", o.node_rank, "this machine's number, 0 … nnodes-1")->check(CLI::NonNegativeNumber);
  cmd->add_option("--master-addr", o.master_addr, "address of rank 0's machine (MASTER_ADDR)");
  cmd->add_option("--master-port", o.master_port,
                  "rendezvous port (MASTER_PORT; default: a free port on one machine, 29500 on several)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--grace", o.grace_seconds, "seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-restarts", o.max_restarts,
                  "when a rank fails, stop the group and start it again, up to N times (torchrun's meaning; crucible "
                  "train resumes bit-exact from its newest checkpoint); not for exit codes 2 and 3 or a failure at "
                  "the step of the previous one")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rdzv-timeout", o.rdzv_timeout_s,
                  "several nodes: seconds the launchers wait for each other at each (re)start, and for the store on "
                  "node 0 to answer, before naming the nodes missing (default 300)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("command", o.command, "the program and its arguments, after `--` (\"crucible\": this program)")
      ->required();
  cmd->footer(
      "\nExample: crucible launch --nproc 2 -- crucible train configs/fashion_mnist.toml\n"
      "Several nodes: each runs crucible launch --nnodes N --node-rank K --master-addr <node 0> --nproc P; node 0's "
      "launcher serves the store at --master-port that every launcher and rank meets in (torchrun's agent store), "
      "and when a rank fails on any node every node's ranks stop and restart together (--max-restarts).");
  return cmd;
}

int run_launch(const distributed::LaunchOptions& o) { return distributed::launch(o); }

CLI::App* add_sampler(CLI::App& app, SamplerArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "sampler", "the sample indices one rank visits in an epoch, as PyTorch's DistributedSampler (X1)");
  cmd->add_option("--n", a.n, "data set size")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--world", a.world, "number of replicas (num_replicas)")->check(CLI::PositiveNumber);
  cmd->add_option("--rank", a.rank, "this replica, 0 … world-1")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a.seed, "sampler seed");
  cmd->add_option("--epoch", a.epoch, "epoch (set_epoch)")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--shuffle", a.shuffle, "a random order per epoch (else 0 … n-1)");
  cmd->add_flag("--drop-last", a.drop_last, "drop the uneven tail instead of padding with the order's start");
  cmd->add_flag("--json", a.json, "print {\"n\", \"world\", \"rank\", \"num_samples\", \"indices\"} as JSON");
  return cmd;
}

int run_sampler(const SamplerArgs& a) {
  const data::DistributedSampler s(a.n, a.shuffle, a.seed, data::Sampler::Shard{a.world, a.rank, a.drop_last});
  const std::vector<int64_t> order = s.epoch_order(a.epoch);
  if (a.json) {
    const nlohmann::ordered_json j = {
        {"n", a.n}, {"world", a.world}, {"rank", a.rank}, {"num_samples", s.num_samples()}, {"indices", order}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < order.size(); ++i) line += fmt::format("{}{}", i == 0 ? "" : " ", order[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace crucible::cli
