// `crucible launch` (X10): starts the processes of a data-parallel job on this machine with
// the environment torchrun gives them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, ROLE_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*; reference:
// torch/distributed/run.py and elastic/agent/server/api.py), so a program that runs under
// torchrun runs under crucible launch unchanged. When one process fails, the others are
// stopped (SIGTERM, then SIGKILL after a grace period) and the failure is named, instead of a
// job that hangs in a collective waiting for a dead peer. Torch-free, Linux only.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace crucible::distributed {

struct LaunchOptions {
  int nproc = 1;      // processes on this node
  int nnodes = 1;     // nodes in the job
  int node_rank = 0;  // this node, 0 … nnodes-1
  std::string master_addr = "127.0.0.1";
  int master_port = 0;               // 0: a free port on this machine when nnodes == 1, else 29500
  std::vector<std::string> command;  // argv; "crucible" as argv[0] means this program (/proc/self/exe)
  double grace_seconds = 10;         // SIGTERM, then SIGKILL after this
  // torchrun's --max-restarts: when a rank fails, every rank of the group is stopped and the
  // group started again, up to this many times (crucible train resumes from its newest
  // checkpoint that verifies, bit-exact). Not restarted: the launcher's own stop signals, exit
  // code 2 (bad input) or 3 (diverged), and a failure at the step where the previous one was.
  int max_restarts = 0;
  // Several nodes: how long the launchers wait for each other at the start of each round (and
  // for the store on node 0 to answer) before giving up and naming the nodes that did not come.
  double rdzv_timeout_s = 300;
};

// The launchers' meeting point when a job spans several nodes (torchrun's agent store): node 0's
// launcher serves a key-value store at master_addr:master_port, every node's launcher and every
// rank use it (the ranks get TORCHELASTIC_USE_AGENT_STORE=True). Through it the launchers start
// each round of the group together, stop every node's ranks when a rank fails on any node, and
// reach the same decision on restarting. An interface so that this file stays torch-free:
// crucible-torch opens c10d's TCPStore (launch_store.cpp). A call that gets no answer within the
// opener's timeout throws; the next call connects again.
class LaunchStore {
 public:
  virtual ~LaunchStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value, or nullopt while the key is unset.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Sets `key` to `value` unless it holds a value already; returns what it holds afterwards
  // (so the first of several callers wins, and each learns which value won).
  virtual std::string set_once(const std::string& key, const std::string& value) = 0;
};
// Opens the store at host:port: serves it there when `serve`, else connects to it, waiting up
// to `timeout_s` for it to answer (and each later call too).
using LaunchStoreOpener =
    std::function<std::unique_ptr<LaunchStore>(const std::string& host, int port, bool serve, double timeout_s)>;

// What a restarted group's ranks find in their environment besides torchrun's
// TORCHELASTIC_RESTART_COUNT: the causes of the restarts so far, a JSON list of {"restart",
// "rank", "cause", "step"} (crucible train puts it in summary.json); and a folder where rank R
// may keep the step it is at as 8 bytes (int64, host order) in "rank<R>" for the launcher.
constexpr const char* kRestartCausesEnv = "CRUCIBLE_LAUNCH_RESTART_CAUSES";
constexpr const char* kProgressDirEnv = "CRUCIBLE_LAUNCH_PROGRESS_DIR";

// Starts nproc processes with the variables torchrun sets and returns the exit code crucible
// launch should exit with: 0 when every rank exits 0, else the exit code of the first rank
// that failed (1 when it died by a signal; 127/126 when the command could not be started) in
// the last start of the group (max_restarts).
// Each child runs in its own process group, so a terminal's Ctrl-C reaches only the launcher,
// which passes SIGINT/SIGTERM/SIGHUP on to every rank once. Call it from the main thread
// (while it runs those signals are blocked and taken with sigtimedwait). Throws bad_input for
// invalid options.
// With several nodes, `store` is required (see LaunchStore); on one node it is not used.
int launch(const LaunchOptions& options, const LaunchStoreOpener& store = nullptr);

// A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0, read it back, close).
int free_port();

}  // namespace crucible::distributed
