// Data-parallel training and evaluation end to end through `crucible launch` (Gloo on this
// machine's loopback): SyncBatchNorm on 2 ranks × 128 equals 1 rank × 256 after 50 steps (M3),
// evaluation on 3 ranks equals a single process exactly (X2, X5), and a rank killed in
// mid-epoch stops the launch naming it, after which a rerun resumes (X10, law 5).
// The default job on 2 ranks against 1 (label slow) is in TrainCliSlow.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/distributed/launch.h"
#include "crucible/train/schedule.h"
#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;
using Clock = std::chrono::steady_clock;

std::vector<std::string> train_cmd(const test::TempDir& dir, const std::string& name,
                                   std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), "train",
                                  "--set", "run.dir=" + dir.path(),
                                  "--set", "run.name=" + name,
                                  "--set", "log.progress=lines"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

using test::launched;

std::string newest_checkpoint(const std::string& run_dir) {
  std::string best;
  for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints")) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && n.find(".tmp") == std::string::npos && e.path().string() > best) {
      best = e.path().string();
    }
  }
  return best;
}

// Run `name`'s summary, expecting the weights and step count of run `reference` (both under d).
json expect_same_result(const test::TempDir& d, const std::string& name, const std::string& reference) {
  const json s = json::parse(test::read_text(d.path() + "/" + name + "/summary.json"));
  const json r = json::parse(test::read_text(d.path() + "/" + reference + "/summary.json"));
  EXPECT_EQ(s["params_sha256"], r["params_sha256"]) << name << " vs " << reference;
  EXPECT_EQ(s["steps"], r["steps"]) << name << " vs " << reference;
  return s;
}

// Rank 1's pid, read from the launcher's first line, once `checkpoint` exists (the run is in
// mid-epoch); -1 when the launch ended or 60 s passed first.
int rank1_pid_once(test::Child& launch, const std::string& checkpoint) {
  const std::regex pid_re("rank 1 pid (\\d+)");
  std::smatch m;
  int pid = -1;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(60) && launch.running()) {
    const std::string out = launch.out();
    if (pid < 0 && std::regex_search(out, m, pid_re)) pid = std::stoi(m[1]);
    if (pid > 0 && fs::exists(checkpoint)) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

// Max |a - b| over the model.* float tensors of two checkpoints, parameters only or with the
// BatchNorm running statistics (Python reads the files).
double max_param_difference(const std::string& a, const std::string& b, bool with_buffers) {
  const std::string out = test::run_python(
      "import json, struct, numpy as np\n"
      "def read(p):\n"
      "    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])\n"
      "    return {k: np.frombuffer(b[8+n+v['data_offsets'][0]:8+n+v['data_offsets'][1]], np.float32)\n"
      "            for k, v in h.items() if k.startswith('model.') and v['dtype'] == 'F32'\n"
      "            and (" + std::string(with_buffers ? "True" : "'running_' not in k") + ")}\n"
      "x, y = read('" + a + "'), read('" + b + "')\n"
      "assert x.keys() == y.keys() and len(x) > 10, (len(x), len(y))\n"
      "print(max(float(np.abs(x[k] - y[k]).max()) for k in x))\n");
  return std::stod(out);
}

// M3 acceptance: 2 ranks × batch 128 with dist.bn = sync run the same 50 steps over the same
// samples as 1 process × 256 (DistributedSampler splits each global batch between the ranks).
// fp32, no dropout, SGD: the only differences are the order of floating-point sums. (AdamW
// turns rounding-level gradient differences into lr-sized steps — 1.1e-3 after 50 steps — and
// so does a large learning rate: training is chaotic; see the closing note of issue 6.) The
// same 2 ranks with per-rank BatchNorm ("broadcast") must land far outside the tolerance, or
// the comparison could not tell synchronised statistics from local ones.
TEST(DistTrain, SyncBatchNormTwoRanksMatchOneProcessM3) {
  test::TempDir d;
  const std::initializer_list<std::string> common = {
      "--set", "train.max_steps=50", "--set", "train.precision=fp32", "--set", "train.channels_last=false",
      "--set", "model.dropout=0", "--set", "optim.name=sgd", "--set", "data.test_samples=100",
      "--set", "checkpoint.every_steps=1000"};
  auto run = [&](const std::string& name, int ranks, const std::string& bn) {
    std::vector<std::string> cmd = train_cmd(d, name, common);
    cmd.insert(cmd.end(), {"--set", "dist.bn=" + bn, "--set", "train.batch_size=" + std::to_string(256 / ranks)});
    const auto r = test::run_command(ranks == 1 ? cmd : launched(ranks, cmd));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string ckpt = newest_checkpoint(d.path() + "/" + name);
    EXPECT_EQ(fs::path(ckpt).filename(), "ckpt-000000050.safetensors");
    return std::make_pair(r.out, ckpt);
  };
  const auto one = run("one", 1, "sync");
  const auto two = run("two", 2, "sync");
  const auto local = run("local", 2, "broadcast");
  expect_contains(two.first, "4 BatchNorm layer(s) take statistics over all 2 ranks (M3)");
  expect_contains(two.first, "batch 128 per rank × 2 ranks = 256");
  const double diff = max_param_difference(one.second, two.second, /*with_buffers=*/true);
  const double sync_params = max_param_difference(one.second, two.second, false);
  const double local_params = max_param_difference(one.second, local.second, false);
  std::printf("after 50 steps, max |2 ranks × 128 - 1 × 256|: sync BN %.3g (parameters %.3g), per-rank BN "
              "parameters %.3g\n", diff, sync_params, local_params);
  EXPECT_LT(diff, 1e-4);
  EXPECT_GT(local_params, 10 * sync_params);
}

// X2/X5: the whole test set on 3 ranks (10000 = 3 × 3333 + 1: the sampler pads 2 samples)
// gives exactly the single-process accuracy and loss.
TEST(DistTrain, EvaluationOnThreeRanksEqualsOneProcessX2) {
  test::TempDir d;
  const auto r = test::run_command(train_cmd(d, "e", {"--set", "train.max_steps=30", "--set", "data.test_samples=100"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> eval = {test::crucible_binary(), "eval", "--set", "run.dir=" + d.path(),
                                         "--set", "run.name=e", "--set", "data.test_samples=0", "--json"};
  const auto single = test::run_command(eval);
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto three = test::run_command(launched(3, eval));
  ASSERT_EQ(three.exit_code, 0) << three.out << three.err;
  auto last_json = [](const std::string& out) {
    return json::parse(out.substr(out.rfind("\n{") + 1));
  };
  const json s = last_json(single.out), t = last_json(three.out);
  std::printf("test accuracy: 1 process %.4f, 3 ranks %.4f; loss %.17g vs %.17g\n", s["test_acc"].get<double>(),
              t["test_acc"].get<double>(), s["test_loss"].get<double>(), t["test_loss"].get<double>());
  EXPECT_EQ(s["test_acc"], t["test_acc"]);
  // The loss to 1e-6 relative, not to the last bit: ranks evaluate in batches of other sizes
  // (1000, 1000, 1000, 334 against 10 × 1000), and oneDNN chooses its bf16 kernels by batch size,
  // so a sample's logits may differ in the last bit (an AVX512-BF16 Xeon gave 1.2e-7 relative; an
  // EPYC none). Counting the 2 padded samples, the bug this guards, moves the loss ~1e-4.
  EXPECT_NEAR(s["test_loss"].get<double>(), t["test_loss"].get<double>(), 1e-6 * s["test_loss"].get<double>());
  EXPECT_EQ(s["params_sha256"], t["params_sha256"]);
  expect_contains(three.out, "(10000 samples over 3 ranks");
  EXPECT_EQ(std::count(three.out.begin(), three.out.end(), '{'), 1) << "only rank 0 prints:\n" << three.out;
}

// X10: SIGKILL to rank 1 in mid-epoch ends the launch within 60 s, non-zero, naming rank 1;
// the same command again resumes from the last checkpoint and finishes.
TEST(DistTrain, KilledRankStopsTheLaunchNamingItAndARerunResumesX10) {
  test::TempDir d;
  const std::vector<std::string> cmd = launched(
      2, train_cmd(d, "k", {"--set", "data.train_samples=8192", "--set", "data.test_samples=500", "--set",
                            "train.epochs=2", "--set", "train.batch_size=64", "--set", "checkpoint.every_steps=10",
                            "--set", "log.every_steps=10"}));
  test::Child launch(cmd, d.path());
  const int pid = rank1_pid_once(launch, d.path() + "/k/checkpoints/ckpt-000000020.safetensors");
  ASSERT_GT(pid, 0) << launch.out() << launch.err();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto t_kill = Clock::now();
  const int code = launch.wait();
  const double secs = std::chrono::duration<double>(Clock::now() - t_kill).count();
  std::printf("launch exited %d, %.2f s after SIGKILL to rank 1\n", code, secs);
  EXPECT_NE(code, 0);
  EXPECT_LT(secs, 60.0);
  expect_contains(launch.err(), "rank 1");
  expect_contains(launch.err(), "SIGKILL");

  const auto again = test::run_command(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  expect_contains(again.out, "resumed from");
  EXPECT_EQ(again.out.find("resumed from step 0"), std::string::npos);
  const json summary = json::parse(test::read_text(d.path() + "/k/summary.json"));
  EXPECT_EQ(summary["steps"], 2 * 64);  // 8192 / (2 × 64) steps per epoch × 2 epochs
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_GT(summary["test_acc"].get<double>(), 0.6);
}

// --max-restarts: rank 1 is SIGKILLed twice in mid-epoch (after the checkpoints of steps 16 and
// 40); the launcher restarts the group each time, the ranks resume from the newest checkpoint,
// and the run ends with the uninterrupted run's params_sha256, its summary counting the two
// restarts and their causes.
TEST(DistTrain, MaxRestartsSurviveTwoKilledRanksBitExact) {
  test::TempDir d;
  const std::initializer_list<std::string> job = {
      "--set", "data.train_samples=4096", "--set", "data.test_samples=200", "--set", "train.epochs=2",
      "--set", "train.batch_size=64", "--set", "checkpoint.every_steps=8", "--set", "log.every_steps=8"};
  const auto clean = test::run_command(launched(2, train_cmd(d, "clean", job)));
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  std::vector<std::string> cmd = {test::crucible_binary(), "launch", "--nproc", "2", "--max-restarts", "3", "--"};
  const auto train = train_cmd(d, "r", job);
  cmd.insert(cmd.end(), train.begin(), train.end());
  test::Child launch(cmd, d.path());
  const std::regex pid_re("rank 1 pid (\\d+)");
  // Rank 1's pid in the launcher's n-th start (n = 1, 2, …), once `checkpoint` exists.
  auto rank1_pid = [&](size_t n, const std::string& checkpoint) {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::seconds(120) && launch.running()) {
      const std::string out = launch.out();
      std::vector<int> pids;
      for (std::sregex_iterator it(out.begin(), out.end(), pid_re), end; it != end; ++it) pids.push_back(std::stoi((*it)[1]));
      if (pids.size() >= n && fs::exists(d.path() + "/r/checkpoints/" + checkpoint)) return pids[n - 1];
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  };
  int pid = rank1_pid(1, "ckpt-000000016.safetensors");
  ASSERT_GT(pid, 0) << launch.out() << launch.err();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  pid = rank1_pid(2, "ckpt-000000040.safetensors");
  ASSERT_GT(pid, 0) << launch.out() << launch.err();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_EQ(launch.wait(), 0) << launch.out() << launch.err();
  const json s = expect_same_result(d, "r", "clean");
  const json c = json::parse(test::read_text(d.path() + "/clean/summary.json"));
  EXPECT_EQ(s["restarts"], 2);
  ASSERT_EQ(s["restart_causes"].size(), 2u) << s["restart_causes"];
  for (const auto& cause : s["restart_causes"]) {
    EXPECT_EQ(cause["rank"], 1);
    EXPECT_EQ(cause["cause"], "was killed by signal 9 (SIGKILL)");
    EXPECT_GE(cause["step"].get<int64_t>(), 16);
  }
  EXPECT_GT(s["restart_causes"][1]["step"].get<int64_t>(), s["restart_causes"][0]["step"].get<int64_t>());
  EXPECT_EQ(c["restarts"], 0);
  expect_contains(launch.err(), "launch: restart 2 of 3 in 2 s after rank 1 was killed by signal 9 (SIGKILL) at step ");
}

// Two nodes (two launchers here, --nnodes 2, one rank each; node 0's launcher serves the store
// both launchers and both ranks use): node 1's rank is killed with SIGKILL in mid-epoch. Node 0's
// launcher stops its own rank at once through the store (not after dist.timeout_s), both
// launchers restart the group in the same round, and the run ends with the weights of one
// machine's 2-rank run (same compute threads) and one restart whose cause names node 1's rank.
TEST(DistTrain, TwoNodesRestartTogetherWhenOneNodesRankDiesBitExact) {
  test::TempDir d;
  const std::initializer_list<std::string> job = {
      "--set", "data.train_samples=2048", "--set", "data.test_samples=200", "--set", "train.epochs=1",
      "--set", "train.batch_size=64", "--set", "checkpoint.every_steps=4", "--set", "log.every_steps=4",
      "--set", "train.threads=1", "--set", "dist.timeout_s=120"};
  const auto one_machine = test::run_command(launched(2, train_cmd(d, "one", job)));
  ASSERT_EQ(one_machine.exit_code, 0) << one_machine.out << one_machine.err;
  const std::string port = std::to_string(distributed::free_port());
  std::vector<std::unique_ptr<test::Child>> nodes;
  for (int k = 0; k < 2; ++k) {
    std::vector<std::string> cmd = {test::crucible_binary(), "launch", "--nnodes", "2", "--node-rank", std::to_string(k),
                                    "--nproc", "1", "--master-port", port, "--max-restarts", "2"};
    cmd.push_back("--");
    const auto train = train_cmd(d, "two", job);
    cmd.insert(cmd.end(), train.begin(), train.end());
    fs::create_directories(d / ("node" + std::to_string(k)));
    nodes.push_back(std::make_unique<test::Child>(cmd, d / ("node" + std::to_string(k))));
  }
  const std::regex pid_re("rank 1 pid (\\d+)");
  std::smatch m;
  int pid = -1;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(120) && nodes[1]->running()) {
    const std::string out = nodes[1]->out();
    if (pid < 0 && std::regex_search(out, m, pid_re)) pid = std::stoi(m[1]);
    if (pid > 0 && fs::exists(d.path() + "/two/checkpoints/ckpt-000000008.safetensors")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(pid, 0) << nodes[1]->out() << nodes[1]->err();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_EQ(nodes[0]->wait(), 0) << nodes[0]->out() << nodes[0]->err();
  ASSERT_EQ(nodes[1]->wait(), 0) << nodes[1]->out() << nodes[1]->err();
  const json s = expect_same_result(d, "two", "one");
  EXPECT_EQ(s["restarts"], 1);
  ASSERT_EQ(s["restart_causes"].size(), 1u) << s["restart_causes"];
  EXPECT_EQ(s["restart_causes"][0]["rank"], 1);
  EXPECT_EQ(s["restart_causes"][0]["node"], 1);
  EXPECT_EQ(s["restart_causes"][0]["cause"], "was killed by signal 9 (SIGKILL)");
  // Node 0 heard it from node 1's launcher (its own rank was still training: dist.timeout_s is 120 s).
  expect_contains(nodes[0]->err(), "launch: rank 1 was killed by signal 9 (SIGKILL) at step ");
  expect_contains(nodes[0]->err(), " on node 1; stopping this node's ranks");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 110.0);
}

// The pid of the process whose command line has `arg` and whose environment has `var` (e.g.
// "RANK=1"), -1 when none.
[[maybe_unused]] int find_process(const std::string& arg, const std::string& var) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = test::read_text(e.path().string() + "/cmdline");
    const std::string environ = test::read_text(e.path().string() + "/environ");
    if (cmdline.find(arg) != std::string::npos && ("\0" + environ).find(std::string("\0", 1) + var + '\0') != std::string::npos) {
      return std::stoi(name);
    }
  }
  return -1;
}

// torchrun (current PyTorch's, from the venv the torch 2.x build uses) starts crucible train as
// crucible launch does: its agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True) and every
// rank is a client of it, with the keys of each restart apart. A rank killed with SIGKILL is
// restarted by torchrun's --max-restarts and the run ends with crucible launch's weights.
TEST(DistTrain, TorchrunRunsAndRestartsCrucibleBitExactX10) {
#ifndef CRUCIBLE_TEST_TORCH2_PYTHON
  GTEST_SKIP() << "needs the torch 2.x venv's torchrun (make test-torch2); Debian's torchrun 1.13 does not start on "
                  "Python 3.11, and another version's agent store speaks a protocol libtorch 1.13 does not";
#else
  test::TempDir d;
  const std::initializer_list<std::string> job = {
      "--set", "data.train_samples=2048", "--set", "data.test_samples=200", "--set", "train.epochs=1",
      "--set", "train.batch_size=64", "--set", "checkpoint.every_steps=4", "--set", "log.every_steps=4",
      "--set", "train.threads=1"};
  const auto ours = test::run_command(launched(2, train_cmd(d, "launch", job)));
  ASSERT_EQ(ours.exit_code, 0) << ours.out << ours.err;
  std::vector<std::string> cmd = {CRUCIBLE_TEST_TORCH2_PYTHON, "-m", "torch.distributed.run", "--no-python",
                                  "--nproc-per-node", "2", "--max-restarts", "1", "--master-port",
                                  std::to_string(distributed::free_port())};
  const auto train = train_cmd(d, "torchrun", job);
  cmd.insert(cmd.end(), train.begin(), train.end());
  test::Child torchrun(cmd, d.path());
  int pid = -1;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(120) && torchrun.running()) {
    if (fs::exists(d.path() + "/torchrun/checkpoints/ckpt-000000008.safetensors")) {
      pid = find_process("run.name=torchrun", "RANK=1");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(pid, 0) << torchrun.out() << torchrun.err();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_EQ(torchrun.wait(), 0) << torchrun.out() << torchrun.err();
  const json s = expect_same_result(d, "torchrun", "launch");
  EXPECT_EQ(s["restarts"], 1);
  expect_contains(torchrun.out() + torchrun.err(), "(the launcher's store)");
#endif
}

// Stragglers: a seam makes one rank D = 150 ms slower per step; the other waits for it at the
// gradient sync. Asserted is what the injection guarantees, so the test holds on a loaded machine
// (ctest -j2 beside training runs, issue 35): summary.json's bottleneck names that rank (rank 1,
// then rank 0) as the straggler, at least D/2 late per step and never later than a step lasts;
// each rank's wait is in it and the straggler waits least; the verdict is communication-bound
// (D is far above a fifth of a step: a step's compute would need to exceed 4·D to hide it); the
// train records carry every rank's wait. Without the seam, a straggler named by chance (one rank
// descheduled more than the other) is far less late than the injected one.
TEST(DistTrain, TheStragglerIsNamedWithHowLateItArrives) {
  test::TempDir d;
  constexpr double kDelayMs = 150;
  auto run = [&](const std::string& name, const std::string& seam) {
    if (!seam.empty()) ::setenv("CRUCIBLE_TEST_SLOW_RANK", seam.c_str(), 1);
    const auto r = test::run_command(launched(
        2, train_cmd(d, name, {"--set", "train.max_steps=16", "--set", "data.train_samples=4096", "--set",
                               "data.test_samples=100", "--set", "train.batch_size=64", "--set", "log.every_steps=8"})));
    ::unsetenv("CRUCIBLE_TEST_SLOW_RANK");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return json::parse(test::read_text(d.path() + "/" + name + "/summary.json"));
  };
  double injected_late_ms = 1e9;
  for (int slow : {1, 0}) {
    const json s = run("slow" + std::to_string(slow), fmt::format("{}:{}", slow, kDelayMs));
    const json& b = s["bottleneck"];
    ASSERT_TRUE(b["straggler"].is_object()) << b.dump(1);
    EXPECT_EQ(b["straggler"]["rank"], slow) << b.dump(1);
    const double late_ms = b["straggler"]["late_ms"].get<double>();
    const double step_ms = 1e3 * s["breakdown"]["step_seconds"].get<double>() / s["breakdown"]["steps"].get<double>();
    EXPECT_GE(late_ms, kDelayMs / 2) << b.dump(1);
    EXPECT_LE(late_ms, step_ms) << b.dump(1);
    injected_late_ms = std::min(injected_late_ms, late_ms);
    EXPECT_EQ(b["verdict"], "communication-bound") << b.dump(1) << "\nstep " << step_ms << " ms";
    expect_contains(b["evidence"].get<std::string>(), "for rank " + std::to_string(slow) + ", the straggler");
    EXPECT_LT(b["sync_wait_ms"][slow].get<double>(), b["sync_wait_ms"][1 - slow].get<double>());
    std::istringstream lines(test::read_text(d.path() + "/slow" + std::to_string(slow) + "/metrics.jsonl"));
    int train_records = 0;
    for (std::string line; std::getline(lines, line);) {
      const json j = json::parse(line);
      if (j["type"] != "train") continue;
      ++train_records;
      ASSERT_EQ(j["sync_wait_ms"].size(), 2u) << line;
    }
    EXPECT_EQ(train_records, 2);
  }
  const json even = run("even", "")["bottleneck"];
  if (even["straggler"].is_object()) {
    EXPECT_LT(even["straggler"]["late_ms"].get<double>(), injected_late_ms / 2) << even.dump(1);
  }
}

// Bucketing is a schedule, not a result: one bucket or several (launched while backward runs)
// give bit-identical weights, and so does a second run (law 1 under data parallel).
TEST(DistTrain, BucketSizeChangesNothingInTheResult) {
  test::TempDir d;
  auto digest = [&](const std::string& name, const std::string& mb) {
    const auto r = test::run_command(launched(
        2, train_cmd(d, name, {"--set", "train.max_steps=20", "--set", "data.test_samples=100", "--set",
                               "dist.bucket_mb=" + mb})));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    expect_contains(r.out, "gradient sync: ");
    return json::parse(test::read_text(d.path() + "/" + name + "/summary.json"))["params_sha256"].get<std::string>();
  };
  const std::string one = digest("one_bucket", "25"), three = digest("three_buckets", "0.25");
  EXPECT_EQ(one, three);
  EXPECT_EQ(digest("again", "25"), one);
}

// No hangs: a rank that stops answering (SIGSTOP: alive, silent) makes the others fail once
// dist.timeout_s has passed, naming it; the launch then ends, non-zero.
TEST(DistTrain, HungRankIsNamedOnceTheTimeoutPassesX10) {
  test::TempDir d;
  std::vector<std::string> cmd = {test::crucible_binary(), "launch", "--nproc", "2", "--grace", "2", "--"};
  for (const auto& a : train_cmd(d, "h", {"--set", "dist.timeout_s=5", "--set", "data.train_samples=20000", "--set",
                                          "train.batch_size=32", "--set", "data.test_samples=100"})) {
    cmd.push_back(a);
  }
  test::Child launch(cmd, d.path());
  const int pid = rank1_pid_once(launch, d.path() + "/h/checkpoints/ckpt-000000100.safetensors");
  ASSERT_GT(pid, 0) << launch.out() << launch.err();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  const auto t_stop = Clock::now();
  const int code = launch.wait();
  const double secs = std::chrono::duration<double>(Clock::now() - t_stop).count();
  std::printf("launch exited %d, %.1f s after SIGSTOP to rank 1 (timeout 5 s, grace 2 s)\n", code, secs);
  EXPECT_NE(code, 0);
  EXPECT_GE(secs, 4.5);  // the timeout, not an earlier guess
  EXPECT_LT(secs, 30.0);
  expect_contains(launch.err(), "rank 1 stopped answering");
  expect_contains(launch.err(), "Timed out");
}

// X8: two ranks train on shared WebDataset tar shards that have no ".idx" offset index yet.
// Rank 0 opens the data first and writes each shard's index; rank 1 opens after it and reads
// them (each rank says what its sources did through CRUCIBLE_TEST_STEP_TRACE's .data file), so
// no two processes write the same file at once. Then a one-process run reads them too.
TEST(DistTrain, RankZeroIndexesSharedTarShardsAndTheOthersReadThemX8) {
  test::TempDir d;
  test::run_python("import io, numpy as np, tarfile\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(3)\n"
                   "for name, n in (('train-0', 48), ('train-1', 48), ('test-0', 32)):\n"
                   "    with tarfile.open('" + d.path() + "/' + name + '.tar', 'w') as t:\n"
                   "        for i in range(n):\n"
                   "            c = i % 2\n"
                   "            a = np.full((20, 20, 3), 40 + 160 * c, np.uint8) + rng.integers(0, 30, (20, 20, 3), dtype=np.uint8)\n"
                   "            b = io.BytesIO(); Image.fromarray(a).save(b, format='PNG')\n"
                   "            for ext, data in (('png', b.getvalue()), ('cls', b'%d' % c)):\n"
                   "                ti = tarfile.TarInfo('s%03d.%s' % (i, ext)); ti.size = len(data); t.addfile(ti, io.BytesIO(data))\n");
  const std::initializer_list<std::string> data = {
      "--set", "data.dataset=images", "--set", "data.train_path=" + d.path() + "/train-{0..1}.tar",
      "--set", "data.test_path=" + (d / "test-0.tar"), "--set", "data.crop=16", "--set", "data.mean=[0.5, 0.5, 0.5]",
      "--set", "data.std=[0.25, 0.25, 0.25]", "--set", "data.eval_crop=16", "--set", "data.eval_resize=20",
      "--set", "train.epochs=2", "--set", "train.batch_size=16", "--set", "train.eval_batch_size=16",
      "--set", "schedule.warmup=0.5"};
  ::setenv("CRUCIBLE_TEST_STEP_TRACE", (d / "trace").c_str(), 1);
  ::setenv("CRUCIBLE_TEST_RANK0_OPEN_DELAY_MS", "500", 1);  // rank 1 would open first if it did not wait
  const auto r = test::run_command(launched(2, train_cmd(d, "tar", data)));
  ::unsetenv("CRUCIBLE_TEST_RANK0_OPEN_DELAY_MS");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string rank0 = test::read_text(d / "trace.rank0.data"), rank1 = test::read_text(d / "trace.rank1.data");
  expect_contains(rank0, "2 tar shards");
  expect_contains(rank0, "offset indexes: 0 read from .idx, 2 built");  // the train shards
  expect_contains(rank0, "offset indexes: 0 read from .idx, 1 built");  // the test shard
  expect_contains(rank1, "offset indexes: 2 read from .idx, 0 built");
  expect_contains(rank1, "offset indexes: 1 read from .idx, 0 built");
  for (const char* f : {"train-0.tar.idx", "train-1.tar.idx", "test-0.tar.idx"}) EXPECT_TRUE(fs::exists(d / f)) << f;
  const auto one = test::run_command(train_cmd(d, "tar1", data));
  ::unsetenv("CRUCIBLE_TEST_STEP_TRACE");
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  expect_contains(test::read_text(d / "trace.rank0.data"), "offset indexes: 2 read from .idx, 0 built");
}

// SLURM: two processes started as srun starts them — only SLURM_* variables, no launcher, no
// torchrun variables — find each other through the first host of the node list and train as
// `crucible launch --nproc 2` does: the same params_sha256.
TEST(DistTrain, SlurmTasksTrainAsTheLauncherDoes) {
  test::TempDir d;
  const std::initializer_list<std::string> job = {"--set", "train.max_steps=12", "--set", "data.train_samples=2048",
                                                  "--set", "data.test_samples=100", "--set", "train.batch_size=64"};
  const auto launch = test::run_command(launched(2, train_cmd(d, "launch", job)));
  ASSERT_EQ(launch.exit_code, 0) << launch.out << launch.err;
  const std::map<std::string, std::string> slurm = {
      {"SLURM_JOB_ID", "4242"},         {"SLURM_STEP_ID", "0"},           {"SLURM_NTASKS", "2"},
      {"SLURM_STEP_NUM_TASKS", "2"},    {"SLURM_NODEID", "0"},            {"SLURM_NNODES", "1"},
      {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_STEP_NODELIST", "localhost"},
      {"MASTER_PORT", std::to_string(distributed::free_port())}};
  for (const auto& [k, v] : slurm) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<std::unique_ptr<test::Child>> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    ::setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
    fs::create_directories(d / ("task" + std::to_string(rank)));
    tasks.push_back(std::make_unique<test::Child>(train_cmd(d, "slurm", job), d / ("task" + std::to_string(rank))));
  }
  for (const auto& [k, v] : slurm) ::unsetenv(k.c_str());
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("SLURM_LOCALID");
  for (auto& t : tasks) EXPECT_EQ(t->wait(), 0) << t->out() << t->err();
  expect_contains(tasks[0]->out(), "data parallel: 2 processes");
  auto sha = [&](const std::string& name) {
    return json::parse(test::read_text(d.path() + "/" + name + "/summary.json"))["params_sha256"].get<std::string>();
  };
  EXPECT_EQ(sha("slurm"), sha("launch"));
  EXPECT_EQ(json::parse(test::read_text(d.path() + "/slurm/summary.json"))["world_size"], 2);
}

// A rendezvous host that does not resolve (a typo, a node list naming an unknown host, DNS down)
// ends every task within seconds, exit 2, naming the host and where it came from, instead of each
// task retrying the connection until dist.timeout_s (issue 35). Hosts under ".invalid" never
// resolve (RFC 6761).
TEST(DistTrain, AnUnknownRendezvousHostExitsTwoWithinSecondsNamingItX10) {
  test::TempDir d;
  const std::initializer_list<std::string> job = {"--set", "train.max_steps=4", "--set", "data.train_samples=512",
                                                  "--set", "data.test_samples=100", "--set", "dist.timeout_s=120"};
  // SLURM: the first host of the step's node list.
  const std::map<std::string, std::string> slurm = {
      {"SLURM_JOB_ID", "4243"},         {"SLURM_STEP_ID", "0"},         {"SLURM_NTASKS", "2"},
      {"SLURM_STEP_NUM_TASKS", "2"},    {"SLURM_NODEID", "0"},          {"SLURM_NNODES", "2"},
      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_STEP_NODELIST", "gpu-nosuch[07-08].invalid"}};
  for (const auto& [k, v] : slurm) ::setenv(k.c_str(), v.c_str(), 1);
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<test::Child>> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    ::setenv("SLURM_NODEID", std::to_string(rank).c_str(), 1);
    ::setenv("SLURM_LOCALID", "0", 1);
    fs::create_directories(d / ("task" + std::to_string(rank)));
    tasks.push_back(std::make_unique<test::Child>(train_cmd(d, "slurm", job), d / ("task" + std::to_string(rank))));
  }
  for (const auto& [k, v] : slurm) ::unsetenv(k.c_str());
  for (const char* k : {"SLURM_PROCID", "SLURM_LOCALID"}) ::unsetenv(k);
  for (auto& t : tasks) {
    EXPECT_EQ(t->wait(), 2) << t->out() << t->err();
    expect_contains(t->err(), {"\"gpu-nosuch07.invalid\"", "SLURM_STEP_NODELIST=gpu-nosuch[07-08].invalid",
                               "does not resolve"});
  }
  const double slurm_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(slurm_s, 30.0) << "dist.timeout_s is 120";
  // torchrun's variables: MASTER_ADDR.
  const std::map<std::string, std::string> torchrun = {{"WORLD_SIZE", "2"}, {"RANK", "1"},          {"LOCAL_RANK", "0"},
                                                       {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_PORT", "29999"},
                                                       {"MASTER_ADDR", "rank0-typo.invalid"}};
  for (const auto& [k, v] : torchrun) ::setenv(k.c_str(), v.c_str(), 1);
  const auto t1 = Clock::now();
  const auto r = test::run_command(train_cmd(d, "torchrun", job));
  for (const auto& [k, v] : torchrun) ::unsetenv(k.c_str());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_contains(r.err, {"\"rank0-typo.invalid\" (from MASTER_ADDR)", "does not resolve"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 30.0);
  // crucible launch: its --master-addr, before any rank starts.
  const auto l = test::run_command({test::crucible_binary(), "launch", "--nproc", "2", "--master-addr",
                                    "rank0-typo.invalid", "--", "true"});
  EXPECT_EQ(l.exit_code, 2) << l.err;
  expect_contains(l.err, {"\"rank0-typo.invalid\" (from launch --master-addr)", "does not resolve"});
  std::printf("unknown host: SLURM tasks ended in %.1f s\n", slurm_s);
}

// M4: multi-scale training on 2 ranks runs each step at the size drawn from (seed, step) —
// recorded by each rank for every step (CRUCIBLE_TEST_STEP_TRACE) and compared: the ranks
// trained the same size at every step, every size of the list occurs, and the sizes equal
// multi_scale_size() (so a resume draws what the uninterrupted run drew). Then evaluation at
// the data's size; the replicas agree at the checkpoint (compared by the trainer).
// Also law 4: only rank 0 prints and writes (X6–X8).
TEST(DistTrain, MultiScaleTrainsOnTwoRanksM4) {
  test::TempDir d;
  ::setenv("CRUCIBLE_TEST_STEP_TRACE", (d / "sizes").c_str(), 1);
  const auto r = test::run_command(launched(
      2, train_cmd(d, "ms", {"--set", "train.multi_scale=[20, 28, 36]", "--set", "train.max_steps=30", "--set",
                             "data.test_samples=500", "--set", "train.batch_size=64"})));
  ::unsetenv("CRUCIBLE_TEST_STEP_TRACE");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_contains(r.out, "multi-scale (M4): each step trains at one of 20, 28, 36 px");
  const auto r0 = test::read_step_trace(d / "sizes", 0), r1 = test::read_step_trace(d / "sizes", 1);
  ASSERT_EQ(r0.size(), 30u);
  EXPECT_EQ(r0, r1) << "the ranks trained different sizes";
  std::set<int64_t> seen;
  for (size_t i = 0; i < r0.size(); ++i) {
    EXPECT_EQ(r0[i].first, static_cast<int64_t>(i));
    EXPECT_EQ(r0[i].second, train::multi_scale_size(0, r0[i].first, {20, 28, 36})) << "step " << i;
    seen.insert(r0[i].second);
  }
  EXPECT_EQ(seen, (std::set<int64_t>{20, 28, 36}));
  const json s = json::parse(test::read_text(d.path() + "/ms/summary.json"));
  EXPECT_GT(s["test_acc"].get<double>(), 0.5);
  // Law 4 (X6–X8): one rank printed, drew progress and wrote the run folder.
  auto count = [](const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(r.out, "eval after step 30"), 1u) << r.out;
  EXPECT_EQ(count(r.out + r.err, "[rank 1]"), 0u) << r.out << r.err;
  EXPECT_EQ(count(test::read_text(d.path() + "/ms/metrics.jsonl"), "\"type\":\"eval\""), 1u);
  EXPECT_EQ(count(test::read_text(d.path() + "/ms/train.log"), "eval after step 30"), 1u);
  const auto bad = test::run_command(train_cmd(d, "bad", {"--set", "train.multi_scale=[2.5]"}));
  EXPECT_EQ(bad.exit_code, 2);
  expect_contains(bad.err, "train.multi_scale: 2.5");
}


// Issue 37, elastic determinism: with data.sampler = "global" and a fixed global batch, a 2-rank
// run killed mid-epoch resumes on 1 and on 3 ranks. The sample ledger (CRUCIBLE_TEST_STEP_TRACE's
// .samples files) shows each step training on the samples it did in the uninterrupted 2-rank run
// and every sample of the epoch once; the weights end close to that run's (fp32, SGD; dropout
// off, BatchNorm synchronised: both would otherwise follow the per-rank batch; the bound below
// says how close), and a resume on 2 ranks is bit-exact.
TEST(DistTrain, AGlobalOrderRunResumesOnOneAndThreeRanksWithTheSameSteps) {
  test::TempDir d;
  const std::initializer_list<std::string> job = {
      "--set", "data.sampler=global",     "--set", "train.global_batch_size=12", "--set", "data.train_samples=480",
      "--set", "data.test_samples=100",   "--set", "train.epochs=1",             "--set", "model.dropout=0",
      "--set", "dist.bn=sync",            "--set", "train.precision=fp32",       "--set", "train.channels_last=false",
      "--set", "optim.name=sgd"};
  auto with = [&](const std::string& name, std::initializer_list<std::string> more) {
    std::vector<std::string> cmd = train_cmd(d, name, job);
    cmd.insert(cmd.end(), more.begin(), more.end());
    return cmd;
  };
  // Per step: the sorted union of the ranks' samples, from every rank's ledger under `prefix`.
  auto ledger = [&](const std::string& prefix, int ranks) {
    std::map<int64_t, std::vector<int64_t>> steps;
    for (int r = 0; r < ranks; ++r) {
      std::istringstream in(test::read_text(prefix + ".rank" + std::to_string(r) + ".samples"));
      for (std::string line; std::getline(in, line);) {
        std::istringstream f(line);
        int64_t step = 0, epoch = 0, id = 0;
        f >> step >> epoch;
        while (f >> id) steps[step].push_back(id);
      }
    }
    for (auto& [step, ids] : steps) std::sort(ids.begin(), ids.end());
    return steps;
  };
  auto run = [&](const std::vector<std::string>& cmd, int ranks, const std::string& trace) {
    ::setenv("CRUCIBLE_TEST_STEP_TRACE", trace.c_str(), 1);
    const auto r = test::run_command(ranks == 1 ? cmd : launched(ranks, cmd));
    ::unsetenv("CRUCIBLE_TEST_STEP_TRACE");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r;
  };
  const auto whole = run(with("whole", {}), 2, d / "whole");
  expect_contains(whole.out + whole.err, "global order");
  const auto reference = ledger(d / "whole", 2);
  ASSERT_EQ(reference.size(), 40u);  // 480 samples, 12 a step
  // Killed (SIGKILL, every process: a preemption) inside the epoch, once the checkpoint of step
  // 16 of 40 is written (checkpoints every 8 steps; rank 0 slowed so the kill lands mid-epoch).
  {
    ::setenv("CRUCIBLE_TEST_STEP_TRACE", (d / "stopped").c_str(), 1);
    ::setenv("CRUCIBLE_TEST_SLOW_RANK", "0:150", 1);
    test::Child launch(launched(2, with("stopped", {"--set", "checkpoint.every_steps=8"})), d.path());
    ::unsetenv("CRUCIBLE_TEST_SLOW_RANK");
    ::unsetenv("CRUCIBLE_TEST_STEP_TRACE");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!fs::exists(d / "stopped/checkpoints/ckpt-000000016.safetensors") &&
           std::chrono::steady_clock::now() < deadline && launch.running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(launch.running()) << "the run ended before step 16's checkpoint: " << launch.err();
    for (const auto& e : fs::directory_iterator("/proc")) {  // the ranks, then the launcher
      const std::string pid = e.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::istringstream stat(test::read_text(e.path().string() + "/stat").substr(
          test::read_text(e.path().string() + "/stat").rfind(')') + 2));
      std::string state;
      int ppid = 0;
      stat >> state >> ppid;
      if (ppid == launch.pid()) ::kill(std::stoi(pid), SIGKILL);
    }
    launch.kill(SIGKILL);
    launch.wait();
  }
  const auto killed = ledger(d / "stopped", 2);
  for (int ranks : {1, 2, 3}) {
    const std::string name = "resumed" + std::to_string(ranks), copy = d / name;  // a run folder per resume
    fs::create_directories(copy);
    fs::copy(d / "stopped", copy + "/stopped", fs::copy_options::recursive);
    const auto r = run(with("stopped", {"--set", "run.dir=" + copy}), ranks, d / name);
    expect_contains(r.out + r.err, fmt::format("batch {} per rank: train.global_batch_size 12 over {} rank", 12 / ranks, ranks));
    std::smatch m;
    const std::string log = r.out + r.err;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("resumed from \\S+: step (\\d+) \\(epoch 1,"))) << log;
    const int64_t from = std::stoll(m[1]);  // 16, or 24 when the kill came after that checkpoint
    EXPECT_TRUE(from == 16 || from == 24) << from;
    auto steps = ledger(d / name, ranks);
    ASSERT_EQ(static_cast<int64_t>(steps.size()), 40 - from) << name;
    ASSERT_EQ(steps.begin()->first, from) << name;
    for (const auto& [step, ids] : killed) {  // the killed run's steps up to its checkpoint; later ones were lost
      if (step < from) steps.emplace(step, ids);
    }
    EXPECT_EQ(steps, reference) << name << ": the steps trained on other samples than the uninterrupted run";
    std::map<int64_t, int> seen;
    for (const auto& [step, ids] : steps) {
      for (int64_t id : ids) ++seen[id];
    }
    EXPECT_EQ(seen.size(), 480u) << name;
    for (const auto& [id, n] : seen) ASSERT_EQ(n, 1) << name << ": sample " << id;
    const std::string a = newest_checkpoint(d / "whole"), b = newest_checkpoint(copy + "/stopped");
    const double diff = max_param_difference(a, b, /*with_buffers=*/true);
    const double params = max_param_difference(a, b, /*with_buffers=*/false);
    std::printf("%d rank(s) from step %lld of a killed 2-rank run: max |weight difference| %.3g (parameters alone "
                "%.3g) against the uninterrupted run\n", ranks, static_cast<long long>(from), diff, params);
    if (ranks == 2) {
      EXPECT_EQ(json::parse(test::read_text(copy + "/stopped/summary.json"))["params_sha256"],
                json::parse(test::read_text(d / "whole/summary.json"))["params_sha256"]);
    } else {
      // Measured: 2.7e-4 on the parameters and 2.6e-3 on BatchNorm's running statistics after 24
      // steps (libtorch 1.13 and 2.14). That is the order of sums, amplified (scripts/
      // elastic-divergence): uninterrupted runs on 1, 2 and 3 ranks agree to a few 1e-6 for 15
      // steps, then a step's gradient differs by 1e-3 where the weights differ by 1e-6 (a
      // max-pool or ReLU taking the other side of a near-tie) and the runs part. Two 2-rank runs
      // that differ only in train.threads (how each sum is split) part at the same step by the
      // same amount as 2 and 3 ranks do. So the bound catches a wrong resume (another sample or
      // step) and cannot be rounding-tight on a 12-sample batch (issue 37's closing note).
      EXPECT_LT(params, 1e-3) << name;
      EXPECT_LT(diff, 1e-2) << name;
    }
  }
  // 5 ranks cannot split 12 samples a step: refused before anything runs, naming both numbers.
  const auto five = test::run_command(launched(5, with("five", {})));
  EXPECT_EQ(five.exit_code, 2) << five.out << five.err;
  expect_contains(five.err, "train.global_batch_size = 12 does not split over 5 ranks");
}
}  // namespace
}  // namespace crucible
