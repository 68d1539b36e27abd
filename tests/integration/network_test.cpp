// Two "nodes" on one machine: network namespaces joined by a veth pair that the test makes
// itself (addresses 10.2xx.y.1 and .2, used only there), one `crucible launch --nnodes 2` in
// each, Gloo on the veth (GLOO_SOCKET_IFNAME). What a real cluster's network does to a run:
// - a link that delays every packet by 50 ms and drops 1% each way trains to the clean link's
//   params_sha256 (tc netem where the kernel has it; else tests/support/lossy_link.py, the same
//   in user space between two TUN devices);
// - a link cut in mid-run stops both ranks within dist.timeout_s, each naming the peer it lost;
// - with --max-restarts, a cut that lasts longer than the timeout is survived: the launchers
//   restart (backing off), the group forms again once the link is back, and the run ends with
//   the clean link's params_sha256.
// Needs root (ip netns); skipped, saying why, without it.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;
using Clock = std::chrono::steady_clock;

int sh(const std::string& command) { return test::run_command({"sh", "-c", command}).exit_code; }

// Two namespaces and the link between them, removed with it. The link is a veth pair, or
// (Link::kLossy) two TUN devices joined by tests/support/lossy_link.py, which forwards each
// packet 50 ms later and drops 1% of them: netem in user space, for kernels without netem. Either
// way each namespace's end is called v0 / v1.
enum class Link { kVeth, kLossy };

class TwoNodes {
 public:
  explicit TwoNodes(Link link = Link::kVeth, int tag = 0) {
    const int id = static_cast<int>((::getpid() + tag * 7) % 200);
    for (int i = 0; i < 2; ++i) {
      ns_[i] = "crucible-" + std::to_string(::getpid()) + "-" + std::to_string(tag) + (i == 0 ? "-a" : "-b");
      addr_[i] = "10.2" + std::to_string(10 + id / 100) + "." + std::to_string(id % 100) + "." + std::to_string(i + 1);
    }
    if (sh("command -v ip >/dev/null") != 0) {
      why_not_ = "no `ip` command (iproute2)";
      return;
    }
    if (sh("ip netns add " + ns_[0]) != 0) {
      why_not_ = "cannot create a network namespace (ip netns add): the network tests need root";
      return;
    }
    made_ = true;
    bool ok = sh("ip netns add " + ns_[1]) == 0;
    if (link == Link::kVeth) {
      ok = ok && sh("ip link add v0 netns " + ns_[0] + " type veth peer name v1 netns " + ns_[1]) == 0 &&
           sh(ip(0) + " addr add " + addr_[0] + "/24 dev v0") == 0 &&
           sh(ip(1) + " addr add " + addr_[1] + "/24 dev v1") == 0;
    } else {
      // The TUN devices are made in this namespace (the forwarder holds them open), then moved.
      const std::string tun[2] = {"cl" + std::to_string(::getpid() % 100000) + "a" + std::to_string(tag),
                                  "cl" + std::to_string(::getpid() % 100000) + "b" + std::to_string(tag)};
      link_dir_ = std::make_unique<test::TempDir>();
      forwarder_ = std::make_unique<test::Child>(
          std::vector<std::string>{test::kPython, std::string(CRUCIBLE_TEST_SUPPORT_DIR) + "/lossy_link.py", "--devs",
                                   tun[0], tun[1], "--delay-ms", "50", "--loss", "0.01", "--ready",
                                   link_dir_->path() + "/ready", "--stats", link_dir_->path() + "/stats"},
          link_dir_->path());
      const auto t0 = Clock::now();
      while (!fs::exists(link_dir_->path() + "/ready") && forwarder_->running() &&
             Clock::now() - t0 < std::chrono::seconds(20)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (int i = 0; i < 2 && ok; ++i) {
        const std::string v = "v" + std::to_string(i);
        ok = fs::exists(link_dir_->path() + "/ready") && sh("ip link set " + tun[i] + " netns " + ns_[i]) == 0 &&
             sh(ip(i) + " link set " + tun[i] + " name " + v) == 0 &&
             sh(ip(i) + " addr add " + addr_[i] + " peer " + addr_[1 - i] + " dev " + v) == 0;
      }
      if (!ok) why_not_ = "cannot make the user-space lossy link (TUN devices, /dev/net/tun): " + forwarder_->err();
    }
    ok = ok && sh(ip(0) + " link set v0 up") == 0 && sh(ip(1) + " link set v1 up") == 0 &&
         sh(ip(0) + " link set lo up") == 0 && sh(ip(1) + " link set lo up") == 0;
    if (!ok && why_not_.empty()) why_not_ = "cannot make the link between " + ns_[0] + " and " + ns_[1];
  }
  ~TwoNodes() {
    if (made_) sh("ip netns del " + ns_[0] + " 2>/dev/null; ip netns del " + ns_[1] + " 2>/dev/null");
  }
  TwoNodes(const TwoNodes&) = delete;
  TwoNodes& operator=(const TwoNodes&) = delete;

  // The lossy link's counts: {"forwarded": [a→b, b→a], "dropped": [a→b, b→a]} (written each second).
  json link_stats() const { return link_dir_ ? json::parse(test::read_text(link_dir_->path() + "/stats")) : json(); }

  bool ready() const { return why_not_.empty(); }
  const std::string& why_not() const { return why_not_; }
  std::string ip(int node) const { return "ip -n " + ns_[node]; }
  std::string exec(int node) const { return "ip netns exec " + ns_[node]; }
  void link(bool up) const { EXPECT_EQ(sh(ip(1) + " link set v1 " + (up ? "up" : "down")), 0); }

  // `crucible launch` of node `node` running `train_args`, as argv.
  std::vector<std::string> launch(int node, const std::vector<std::string>& extra_launch,
                                  const std::vector<std::string>& train_args) const {
    std::vector<std::string> argv = {"ip", "netns", "exec", ns_[node], "env", "GLOO_SOCKET_IFNAME=v" + std::to_string(node),
                                     test::crucible_binary(), "launch", "--grace", "2", "--nnodes", "2", "--node-rank",
                                     std::to_string(node), "--nproc", "1", "--master-addr", addr_[0], "--master-port",
                                     "29500"};
    argv.insert(argv.end(), extra_launch.begin(), extra_launch.end());
    argv.emplace_back("--");
    argv.emplace_back(test::crucible_binary());
    argv.insert(argv.end(), train_args.begin(), train_args.end());
    return argv;
  }

 private:
  std::string ns_[2], addr_[2];
  bool made_ = false;
  std::string why_not_;
  std::unique_ptr<test::TempDir> link_dir_;
  std::unique_ptr<test::Child> forwarder_;
};

std::vector<std::string> train_args(const test::TempDir& d, const std::string& name, int steps) {
  return {"train", "--set", "run.dir=" + d.path(), "--set", "run.name=" + name, "--set",
          "train.max_steps=" + std::to_string(steps), "--set", "data.train_samples=4096", "--set",
          "data.test_samples=100", "--set", "train.batch_size=64", "--set", "log.every_steps=10", "--set",
          "log.progress=lines", "--set", "checkpoint.every_steps=10", "--set", "dist.timeout_s=8"};
}

struct Ends {
  int code[2] = {-1, -1};
  std::string err[2];
  double seconds = 0;  // from `t0` until both ended
};

// Starts both nodes, calls `during` while they run, waits for both.
template <typename F>
Ends run_two(const test::TempDir& d, const TwoNodes& nodes, const std::vector<std::string>& extra_launch,
             const std::vector<std::string>& args, F during) {
  fs::create_directories(d / "node0");
  fs::create_directories(d / "node1");
  test::Child a(nodes.launch(0, extra_launch, args), d / "node0");
  test::Child b(nodes.launch(1, extra_launch, args), d / "node1");
  const Clock::time_point t0 = during();
  Ends e;
  e.code[0] = a.wait();
  e.code[1] = b.wait();
  e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  e.err[0] = a.out() + a.err();
  e.err[1] = b.out() + b.err();
  return e;
}

std::string sha(const test::TempDir& d, const std::string& name) {
  return json::parse(test::read_text(d / (name + "/summary.json")))["params_sha256"].get<std::string>();
}

bool wait_for(const std::string& path, double seconds) {
  const auto t0 = Clock::now();
  while (!fs::exists(path)) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

TEST(Network, ADelayedLossyLinkTrainsToTheCleanLinksWeights) {
  TwoNodes nodes;
  if (!nodes.ready()) GTEST_SKIP() << nodes.why_not();
  test::TempDir d;
  const auto clean = run_two(d, nodes, {}, train_args(d, "clean", 10), [] { return Clock::now(); });
  ASSERT_EQ(clean.code[0], 0) << clean.err[0] << clean.err[1];
  ASSERT_EQ(clean.code[1], 0) << clean.err[1];
  // 50 ms and 1% loss each way: netem on the veth where the kernel has it, else (this kernel:
  // "Specified qdisc kind is unknown") the user-space lossy link between two new namespaces.
  std::unique_ptr<TwoNodes> lossy;
  const TwoNodes* slow_nodes = &nodes;
  const std::string netem = "netem delay 50ms loss 1%";
  const bool has_netem = sh(nodes.exec(0) + " tc qdisc add dev v0 root " + netem + " 2>/dev/null") == 0;
  if (has_netem) {
    ASSERT_EQ(sh(nodes.exec(1) + " tc qdisc add dev v1 root " + netem), 0);
  } else {
    lossy = std::make_unique<TwoNodes>(Link::kLossy, 1);
    ASSERT_TRUE(lossy->ready()) << lossy->why_not();
    slow_nodes = lossy.get();
  }
  std::vector<std::string> args = train_args(d, "slow", 10);
  args.insert(args.end(), {"--set", "dist.timeout_s=120"});  // a lost packet's retransmission may take seconds
  const auto slow = run_two(d, *slow_nodes, {}, args, [] { return Clock::now(); });
  std::printf("delay 50 ms + loss 1%% each way (%s): 10 steps in %.1f s, the clean link's in %.1f s\n",
              has_netem ? "netem" : "lossy_link.py", slow.seconds, clean.seconds);
  ASSERT_EQ(slow.code[0], 0) << slow.err[0] << slow.err[1];
  ASSERT_EQ(slow.code[1], 0) << slow.err[1];
  // The link did delay and drop packets (its own counters), and changed nothing in the weights.
  if (has_netem) {
    const auto stats = test::run_command({"sh", "-c", nodes.exec(0) + " tc -s qdisc show dev v0"});
    std::printf("%s", stats.out.c_str());
    std::smatch m;
    EXPECT_TRUE(std::regex_search(stats.out, m, std::regex("dropped ([1-9][0-9]*)"))) << stats.out;
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the counts are written each second
    const json stats = lossy->link_stats();
    std::printf("lossy link: %s\n", stats.dump().c_str());
    for (int dir = 0; dir < 2; ++dir) {
      const double forwarded = stats["forwarded"][dir].get<double>(), dropped = stats["dropped"][dir].get<double>();
      EXPECT_GT(forwarded, 1000) << stats;
      EXPECT_GT(dropped, 0) << stats;
      EXPECT_NEAR(dropped / (forwarded + dropped), 0.01, 0.006) << stats;
    }
    // 50 ms each way: the ranks' first connection alone waits a round trip of 100 ms or more.
    EXPECT_GT(slow.seconds, clean.seconds) << "the delay did not slow the run";
  }
  EXPECT_EQ(sha(d, "slow"), sha(d, "clean"));
}

TEST(Network, ACutLinkStopsEveryRankNamingThePeerAndRestartsSurviveIt) {
  TwoNodes nodes;
  if (!nodes.ready()) GTEST_SKIP() << nodes.why_not();
  test::TempDir d;
  // No restarts: both ranks stop within dist.timeout_s (8 s; + the diagnosis and the grace).
  const auto cut = run_two(d, nodes, {}, train_args(d, "cut", 300), [&] {
    EXPECT_TRUE(wait_for(d / "cut/checkpoints/ckpt-000000020.safetensors", 120));
    nodes.link(false);
    return Clock::now();
  });
  std::printf("cut link: both launchers ended %.1f s after the cut\n", cut.seconds);
  EXPECT_EQ(cut.code[0], 1) << cut.err[0];
  EXPECT_EQ(cut.code[1], 1) << cut.err[1];
  EXPECT_LT(cut.seconds, 30.0);
  expect_contains(cut.err[0], "rank 1 stopped answering");
  // Node 0's launcher serves the ranks' store: from node 1, node 0 is what is out of reach.
  expect_contains(cut.err[1], "node 0 (rank 0) stopped answering (the rendezvous store at 10.");
  nodes.link(true);

  // --max-restarts: the link stays down for 15 s (longer than the timeout), then comes back.
  const auto clean = run_two(d, nodes, {}, train_args(d, "clean", 60), [] { return Clock::now(); });
  ASSERT_EQ(clean.code[0], 0) << clean.err[0] << clean.err[1];
  const auto restarted = run_two(d, nodes, {"--max-restarts", "6"}, train_args(d, "restarted", 60), [&] {
    EXPECT_TRUE(wait_for(d / "restarted/checkpoints/ckpt-000000020.safetensors", 120));
    nodes.link(false);
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(15));
    nodes.link(true);
    return t0;
  });
  EXPECT_EQ(restarted.code[0], 0) << restarted.err[0];
  EXPECT_EQ(restarted.code[1], 0) << restarted.err[1];
  expect_contains(restarted.err[0], "launch: restart 1 of 6");
  expect_contains(restarted.err[0], "resumed from");
  const json s = json::parse(test::read_text(d / "restarted/summary.json"));
  EXPECT_GE(s["restarts"].get<int>(), 1);
  EXPECT_EQ(s["steps"], 60);
  EXPECT_EQ(sha(d, "restarted"), sha(d, "clean"));
}

}  // namespace
}  // namespace crucible
