// `crucible sampler` and `crucible launch` end to end: a rank's indices equal python3-torch's
// DistributedSampler (X1); launch passes everything after `--` on untouched, returns and names
// the failing rank, passes a SIGTERM it gets to every rank, takes its ranks along when it is
// killed, and bad usage exits 2 (X10).
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "crucible/distributed/launch.h"
#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Waits (up to `seconds`) until every file exists and is not empty.
bool files_appear(const std::vector<std::string>& paths, double seconds) {
  const auto t0 = Clock::now();
  for (;;) {
    bool all = true;
    for (const auto& p : paths) all = all && !test::read_text(p).empty();
    if (all) return true;
    if (seconds_since(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// True once `pid` has ended (gone, or a zombie nobody reaps: an orphan in a container).
bool ends_within(std::string pid, double seconds) {
  pid = pid.substr(0, pid.find('\n'));
  const auto t0 = Clock::now();
  for (;;) {
    const std::string stat = test::read_text("/proc/" + pid + "/stat");
    const size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z')) return true;
    if (seconds_since(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> launch_sh(int nproc, const std::string& script) {
  return {test::crucible_binary(), "launch", "--nproc", std::to_string(nproc), "--", "sh", "-c", script};
}

TEST(DistCli, SamplerJsonEqualsPytorchDistributedSamplerX1) {
  struct Case {
    int n, world, rank, seed, epoch;
    bool shuffle, drop;
  };
  const std::vector<Case> cases = {{10, 3, 1, 42, 3, true, false},
                                   {17, 4, 3, 0, 0, true, true},
                                   {5, 7, 6, 1, 2, false, false},
                                   {100, 2, 0, 7, 1, true, false},
                                   {60000, 8, 5, 123, 9, true, true}};
  std::string script = "import json\nfrom torch.utils.data import DistributedSampler\n";
  for (const auto& c : cases) {
    script += "s = DistributedSampler(range(" + std::to_string(c.n) + "), num_replicas=" + std::to_string(c.world) +
              ", rank=" + std::to_string(c.rank) + ", shuffle=" + (c.shuffle ? "True" : "False") +
              ", seed=" + std::to_string(c.seed) + ", drop_last=" + (c.drop ? "True" : "False") + ")\n"
              "s.set_epoch(" + std::to_string(c.epoch) + ")\nprint(json.dumps([len(s), list(s)]))\n";
  }
  std::istringstream expected(test::run_python(script));
  for (const auto& c : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(expected, line));
    const json want = json::parse(line);
    std::vector<std::string> cmd = {test::crucible_binary(), "sampler", "--n", std::to_string(c.n),
                                    "--world", std::to_string(c.world), "--rank", std::to_string(c.rank),
                                    "--seed", std::to_string(c.seed), "--epoch", std::to_string(c.epoch), "--json"};
    if (c.shuffle) cmd.push_back("--shuffle");
    if (c.drop) cmd.push_back("--drop-last");
    auto r = test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json got = json::parse(r.out);
    EXPECT_EQ(got["n"], c.n);
    EXPECT_EQ(got["world"], c.world);
    EXPECT_EQ(got["rank"], c.rank);
    EXPECT_EQ(got["num_samples"], want[0]) << line;
    EXPECT_EQ(got["indices"], want[1]) << "n=" << c.n << " world=" << c.world << " rank=" << c.rank;
  }
  // Without --json: one line of space-separated indices.
  auto r = test::run_command({test::crucible_binary(), "sampler", "--n", "7", "--world", "2", "--rank", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 3 5 0\n");
}

TEST(DistCli, SamplerBadUsageExitsTwoX1) {
  auto r = test::run_command({test::crucible_binary(), "sampler", "--n", "10", "--world", "2", "--rank", "2"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "rank must be in [0, 2)");
  EXPECT_EQ(test::run_command({test::crucible_binary(), "sampler", "--world", "2"}).exit_code, 2);  // no --n
  EXPECT_EQ(test::run_command({test::crucible_binary(), "sampler", "--n", "10", "--world", "0"}).exit_code, 2);
}

TEST(DistCli, LaunchPassesArgumentsAfterDashDashUntouchedX10) {
  auto r = test::run_command({test::crucible_binary(), "launch", "--nproc", "1", "--", "sh", "-c",
                              "printf '%s|' \"$@\"", "sh", "--nproc", "-x", "--", "train", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "--nproc|-x|--|train|--help|");
  expect_contains(r.out, "launch: 1 process (rank 0 of 1, node 0 of 1), master 127.0.0.1:");
  // "crucible" is this very program, whatever PATH holds.
  r = test::run_command({test::crucible_binary(), "launch", "--nproc", "2", "--", "crucible", "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "crucible " CRUCIBLE_VERSION);
}

TEST(DistCli, LaunchReturnsAndNamesTheFailingRankX10) {
  auto t0 = Clock::now();
  auto r = test::run_command(launch_sh(2, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 7; fi; sleep 60"));
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_LT(seconds_since(t0), 20.0);
  expect_contains(r.err, "launch: rank 1 (pid ");
  expect_contains(r.err, "exited with code 7; stopping the other ranks");

  t0 = Clock::now();
  r = test::run_command(launch_sh(2, "if [ \"$RANK\" = 1 ]; then sleep 0.2; kill -KILL $$; fi; sleep 60"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_LT(seconds_since(t0), 20.0);
  expect_contains(r.err, "launch: rank 1 (pid ");
  expect_contains(r.err, "was killed by signal 9 (SIGKILL); stopping the other ranks");

  r = test::run_command({test::crucible_binary(), "launch", "--nproc", "2", "--", "crucible-no-such-program"});
  EXPECT_EQ(r.exit_code, 127);
  expect_contains(r.err, "command not found");
}

// --max-restarts, the launcher's rules with a shell for ranks (the training case is
// DistTrain.MaxRestartsSurviveTwoKilledRanksBitExact):
// - a group whose rank 1 fails on its first two starts and succeeds on the third finishes, 0,
//   and the restarted ranks see torchrun's TORCHELASTIC_RESTART_COUNT and the causes so far;
// - restarts used up: the last failure's code, naming it;
// - exit code 2 (bad input) is not restarted;
// - a failure at the step of the previous one (from the rank's progress file) is not restarted.
TEST(DistCli, MaxRestartsRestartsTheGroupUntilItSucceedsOrRepeats) {
  test::TempDir d;
  const std::string dir = "'" + d.path() + "'";
  auto restarts = [](int n, const std::string& script) {
    return std::vector<std::string>{test::crucible_binary(), "launch", "--nproc", "2", "--max-restarts",
                                    std::to_string(n), "--grace", "1", "--", "sh", "-c", script};
  };
  auto count = [](const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  auto r = test::run_command(restarts(
      3, "echo \"$TORCHELASTIC_RESTART_COUNT $CRUCIBLE_LAUNCH_RESTART_CAUSES\" > " + dir + "/seen.$RANK; "
         "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ]; then exit 5; fi; exit 0"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err, "launch: restart "), 2u) << r.err;
  expect_contains(r.err, "launch: restart 2 of 3 in 2 s after rank 1 exited with code 5");
  const std::string seen = test::read_text(d / "seen.0");
  expect_contains(seen, "2 [{\"cause\":\"exited with code 5\",\"rank\":1,\"restart\":1,\"step\":null},");

  r = test::run_command(restarts(2, "if [ \"$RANK\" = 1 ]; then exit 6; fi; sleep 30"));
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_EQ(count(r.err, "launch: restart "), 2u) << r.err;
  expect_contains(r.err, "not restarting: all 2 restart(s) of --max-restarts are used; the last failure: rank 1 "
                         "exited with code 6");

  r = test::run_command(restarts(3, "if [ \"$RANK\" = 0 ]; then exit 2; fi; sleep 30"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count(r.err, "launch: restart "), 0u) << r.err;
  expect_contains(r.err, "bad input or usage (exit code 2)");

  // Rank 1 writes step 5 (8 bytes, little-endian int64) to its progress file, then fails.
  r = test::run_command(restarts(
      3, "if [ \"$RANK\" = 1 ]; then printf '\\005\\000\\000\\000\\000\\000\\000\\000' > "
         "\"$CRUCIBLE_LAUNCH_PROGRESS_DIR/rank1\"; exit 4; fi; sleep 30"));
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_EQ(count(r.err, "launch: restart "), 1u) << r.err;
  expect_contains(r.err, "rank 1 exited with code 4 at step 5, where the last failure happened too");
}

// Several nodes (two launchers on this machine, --nnodes 2, one rank each): node 0's launcher
// serves the store both launchers and the ranks meet in (torchrun's agent store), and the
// launchers move together:
// - the ranks get TORCHELASTIC_USE_AGENT_STORE=True and MASTER_PORT = that store;
// - a rank failing on node 1 stops node 0's ranks too, both restart in the same round, and both
//   launchers record the same cause (node 1's rank);
// - a failure on node 1 after node 0's ranks finished brings node 0 back for the restart;
// - exit code 2 on node 1 ends both launchers with 2, without a restart;
// - launchers that disagree on --max-restarts are refused (exit 2), naming both settings;
// - a node that never comes is named after --rdzv-timeout.
TEST(DistCli, NodesLaunchersRestartTogetherThroughNodeZerosStoreX10) {
  test::TempDir d;
  const std::string dir = "'" + d.path() + "'";
  auto two_nodes = [&](const std::string& script, int max_restarts, int node1_max_restarts = -1,
                       bool start_node1 = true) {
    const std::string port = std::to_string(distributed::free_port());
    std::vector<test::CommandResult> out(2);
    std::vector<std::pair<int, std::unique_ptr<test::Child>>> nodes;
    for (int k = 1; k >= 0; --k) {
      if (k == 1 && !start_node1) continue;
      std::vector<std::string> cmd = {test::crucible_binary(), "launch", "--nnodes", "2", "--node-rank",
                                      std::to_string(k), "--master-port", port, "--nproc", "1", "--grace", "1",
                                      "--rdzv-timeout", start_node1 ? "60" : "4", "--max-restarts",
                                      std::to_string(k == 1 && node1_max_restarts >= 0 ? node1_max_restarts : max_restarts)};
      cmd.insert(cmd.end(), {"--", "sh", "-c", script});
      const std::string logs = d.path() + "/node" + std::to_string(k);
      std::filesystem::create_directories(logs);
      nodes.emplace_back(k, std::make_unique<test::Child>(cmd, logs));
    }
    for (auto& [k, child] : nodes) {
      out[static_cast<size_t>(k)].exit_code = child->wait();
      out[static_cast<size_t>(k)].err = child->err();
    }
    out[1].out = port;
    return out;
  };
  // Node 1's rank fails on the first start, after node 0's rank has begun its long sleep.
  auto r = two_nodes("cd " + dir + "; echo \"$TORCHELASTIC_USE_AGENT_STORE $MASTER_PORT $TORCHELASTIC_RESTART_COUNT\" "
                     ">> seen.$GROUP_RANK; if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then if [ \"$GROUP_RANK\" = 1 ]; "
                     "then sleep 1; exit 5; fi; sleep 30; fi; exit 0",
                     2);
  EXPECT_EQ(r[0].exit_code, 0) << r[0].err;
  EXPECT_EQ(r[1].exit_code, 0) << r[1].err;
  const std::string port = r[1].out;
  EXPECT_EQ(test::read_text(d / "seen.0"), "True " + port + " 0\nTrue " + port + " 1\n");
  EXPECT_EQ(test::read_text(d / "seen.1"), "True " + port + " 0\nTrue " + port + " 1\n");
  expect_contains(r[0].err, "launch: rank 1 exited with code 5 on node 1; stopping this node's ranks");
  for (const auto& n : r) {
    expect_contains(n.err, "launch: restart 1 of 2 in 1 s after rank 1 exited with code 5 on node 1: every rank on "
                           "every node starts again");
  }

  // Node 0's rank finishes at once; node 1's fails a second later, once.
  r = two_nodes("cd " + dir + "; echo $TORCHELASTIC_RESTART_COUNT >> late.$GROUP_RANK; if [ \"$GROUP_RANK\" = 1 ] && "
                "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then sleep 1; exit 7; fi; exit 0",
                1);
  EXPECT_EQ(r[0].exit_code, 0) << r[0].err;
  EXPECT_EQ(r[1].exit_code, 0) << r[1].err;
  EXPECT_EQ(test::read_text(d / "late.0"), "0\n1\n");
  expect_contains(r[0].err, "launch: rank 1 exited with code 7 on node 1 after this node's ranks finished");

  r = two_nodes("if [ \"$GROUP_RANK\" = 1 ]; then exit 2; fi; sleep 30", 3);
  EXPECT_EQ(r[0].exit_code, 2) << r[0].err;
  EXPECT_EQ(r[1].exit_code, 2) << r[1].err;
  for (const auto& n : r) {
    expect_contains(n.err, "not restarting: rank 1 exited with code 2 on node 1, bad input or usage");
  }

  r = two_nodes("exit 0", 3, 1);
  EXPECT_EQ(r[0].exit_code, 2) << r[0].err;
  EXPECT_EQ(r[1].exit_code, 2) << r[1].err;
  expect_contains(r[1].err, "node 0 runs with --nproc 1 --max-restarts 3 and this node (node 1) with --nproc 1 "
                            "--max-restarts 1");

  // SIGTERM to node 0's launcher: its rank gets it, node 1's launcher hears it and stops its own
  // without restarting, although restarts are left.
  {
    const std::string port = std::to_string(distributed::free_port());
    std::vector<std::unique_ptr<test::Child>> nodes;
    for (int k = 0; k < 2; ++k) {
      const std::string logs = d.path() + "/term" + std::to_string(k);
      std::filesystem::create_directories(logs);
      nodes.push_back(std::make_unique<test::Child>(
          std::vector<std::string>{test::crucible_binary(), "launch", "--nnodes", "2", "--node-rank", std::to_string(k),
                                   "--master-port", port, "--nproc", "1", "--grace", "1", "--max-restarts", "3", "--",
                                   "sh", "-c", "echo up > " + dir + "/up.$GROUP_RANK; sleep 60"},
          logs));
    }
    ASSERT_TRUE(files_appear({d / "up.0", d / "up.1"}, 30)) << nodes[0]->err() << nodes[1]->err();
    const auto t0 = Clock::now();
    nodes[0]->kill(SIGTERM);
    EXPECT_EQ(nodes[0]->wait(), 1) << nodes[0]->err();  // its rank died of the SIGTERM
    EXPECT_NE(nodes[1]->wait(), 0) << nodes[1]->err();
    EXPECT_LT(seconds_since(t0), 20.0);
    expect_contains(nodes[1]->err(), "launch: not restarting: the launcher on node 0 got SIGTERM");
    EXPECT_EQ(nodes[1]->err().find("launch: restart "), std::string::npos) << nodes[1]->err();
  }

  r = two_nodes("exit 0", 0, -1, /*start_node1=*/false);
  EXPECT_EQ(r[0].exit_code, 1) << r[0].err;
  expect_contains(r[0].err, "launch: node(s) 1 did not join round 0 of the group within --rdzv-timeout 4 s");
}

TEST(DistCli, SigtermToTheLauncherReachesEveryRankX10) {
  test::TempDir d;
  const std::string dir = "'" + d.path() + "'";
  test::Child launcher(launch_sh(2, "cd " + dir + "; trap 'echo stopped > term.$RANK; exit 0' TERM; "
                                    "echo ready > ready.$RANK; while true; do sleep 0.1; done"),
                       d.path());
  ASSERT_TRUE(files_appear({d / "ready.0", d / "ready.1"}, 20)) << launcher.err();
  const auto t0 = Clock::now();
  launcher.kill(SIGTERM);
  const int rc = launcher.wait();
  EXPECT_LT(seconds_since(t0), 8.0);
  EXPECT_EQ(rc, 0) << launcher.err();  // both ranks handled it and exited 0
  EXPECT_EQ(test::read_text(d / "term.0"), "stopped\n");
  EXPECT_EQ(test::read_text(d / "term.1"), "stopped\n");
  expect_contains(launcher.err(), "launch: got SIGTERM; passing it to every rank");
}

TEST(DistCli, KilledLauncherTakesItsRanksAlongX10) {
  test::TempDir d;
  const std::string dir = "'" + d.path() + "'";
  test::Child launcher(launch_sh(2, "cd " + dir + "; echo $$ > tmp.$RANK; mv tmp.$RANK pid.$RANK; exec sleep 60"),
                       d.path());
  ASSERT_TRUE(files_appear({d / "pid.0", d / "pid.1"}, 20)) << launcher.err();
  launcher.kill(SIGKILL);
  EXPECT_EQ(launcher.wait(), 128 + SIGKILL);
  EXPECT_TRUE(ends_within(test::read_text(d / "pid.0"), 10)) << "rank 0 outlived the launcher";
  EXPECT_TRUE(ends_within(test::read_text(d / "pid.1"), 10)) << "rank 1 outlived the launcher";
}

TEST(DistCli, LaunchBadUsageExitsTwoX10) {
  auto r = test::run_command({test::crucible_binary(), "launch", "--nproc", "2"});  // no command
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "command");
  EXPECT_EQ(test::run_command({test::crucible_binary(), "launch", "--nproc", "0", "--", "true"}).exit_code, 2);
  r = test::run_command({test::crucible_binary(), "launch", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "--node-rank must be in [0, 2)");
  EXPECT_EQ(test::run_command({test::crucible_binary(), "launch", "--master-port", "70000", "--", "true"}).exit_code, 2);
}

}  // namespace
}  // namespace crucible
