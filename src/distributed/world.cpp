#include "crucible/distributed/world.h"

#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/distributed/launch.h"

namespace crucible::distributed {
namespace {

// An integer variable, or `fallback` when unset.
int int_var(const std::function<const char*(const char*)>& getenv, const char* name, int fallback, int lo) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > 1 << 24) {
    throw bad_input("environment variable {}=\"{}\": expected an integer ≥ {}", name, v, lo);
  }
  return static_cast<int>(x);
}

// Splits at commas outside brackets.
std::vector<std::string> top_level_items(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw bad_input("{}=\"{}\": a ']' without its '['", what, list);
    if (c == ',' && depth == 0) {
      out.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw bad_input("{}=\"{}\": a '[' without its ']'", what, list);
  out.push_back(item);
  for (const auto& i : out) {
    if (i.empty()) throw bad_input("{}=\"{}\": an empty host name", what, list);
  }
  return out;
}

// One host pattern: the first bracket group expanded, the rest recursively.
void expand_item(const std::string& item, const std::string& list, const std::string& what,
                 std::vector<std::string>& out) {
  const auto open = item.find('[');
  if (open == std::string::npos) {
    out.push_back(item);
    return;
  }
  const auto close = item.find(']', open);
  const std::string prefix = item.substr(0, open), rest = item.substr(close + 1);
  for (const std::string& range : top_level_items(item.substr(open + 1, close - open - 1), what)) {
    const auto dash = range.find('-');
    const std::string lo_text = range.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
    auto number = [&](const std::string& t) {
      if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) {
        throw bad_input("{}=\"{}\": \"{}\" in brackets is not a number or a range a-b", what, list, range);
      }
      return std::stol(t);
    };
    const long lo = number(lo_text), hi = number(hi_text);
    if (hi < lo) throw bad_input("{}=\"{}\": the range {} runs backwards", what, list, range);
    if (hi - lo > 100000) throw bad_input("{}=\"{}\": the range {} is too long", what, list, range);
    for (long n = lo; n <= hi; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
      expand_item(prefix + digits + rest, list, what, out);
    }
  }
}

// The tasks on node `node` from SLURM_TASKS_PER_NODE ("2(x3),1": two on each of the first three
// nodes, one on the fourth).
int tasks_on_node(const std::string& spec, int node) {
  int first = 0;
  for (const std::string& part : top_level_items(spec, "SLURM_TASKS_PER_NODE")) {
    int count = 0, repeat = 1;
    char tail[8] = {0};
    if (std::sscanf(part.c_str(), "%d(x%d)%7s", &count, &repeat, tail) < 1 || count < 1 || repeat < 1) {
      throw bad_input("SLURM_TASKS_PER_NODE=\"{}\": expected counts such as \"2(x3),1\"", spec);
    }
    if (node < first + repeat) return count;
    first += repeat;
  }
  throw bad_input("SLURM_TASKS_PER_NODE=\"{}\" lists fewer nodes than SLURM_NODEID={}", spec, node);
}

// A SLURM step's world (srun): no torchrun variables, SLURM_PROCID and SLURM_STEP_ID set.
World slurm_world(const std::function<const char*(const char*)>& getenv) {
  World w;
  w.launched = true;
  w.launcher = "slurm";
  const bool step_tasks = getenv("SLURM_STEP_NUM_TASKS") != nullptr;
  w.size = int_var(getenv, step_tasks ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", 1, 1);
  w.rank = int_var(getenv, "SLURM_PROCID", 0, 0);
  if (w.rank >= w.size) {
    throw bad_input("SLURM_PROCID={} but the step has {} tasks: a rank must be below the world size", w.rank, w.size);
  }
  w.local_rank = int_var(getenv, "SLURM_LOCALID", 0, 0);
  w.node_rank = int_var(getenv, "SLURM_NODEID", 0, 0);
  const char* per_node = getenv("SLURM_NTASKS_PER_NODE");
  const char* tasks_per_node = getenv(step_tasks ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE");
  if (tasks_per_node == nullptr) tasks_per_node = getenv("SLURM_TASKS_PER_NODE");
  if (per_node != nullptr && *per_node != '\0') {
    w.local_size = int_var(getenv, "SLURM_NTASKS_PER_NODE", 1, 1);
  } else if (tasks_per_node != nullptr && *tasks_per_node != '\0') {
    w.local_size = tasks_on_node(tasks_per_node, w.node_rank);
  } else {
    const int nodes = int_var(getenv, "SLURM_NNODES", 1, 1);
    w.local_size = (w.size + nodes - 1) / nodes;
  }
  if (w.local_rank >= w.local_size) {
    throw bad_input("SLURM_LOCALID={} but {} tasks on this node: a local rank must be below it", w.local_rank,
                    w.local_size);
  }
  const char* addr = getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') {
    w.master_addr = addr;
    w.master_addr_from = "MASTER_ADDR";
  } else {
    const char* name = getenv("SLURM_STEP_NODELIST") != nullptr ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const char* list = getenv(name);
    if (list == nullptr || *list == '\0') {
      throw bad_input("a SLURM step of {} tasks but neither MASTER_ADDR nor SLURM_STEP_NODELIST/SLURM_JOB_NODELIST "
                      "is set: rank 0's host is unknown",
                      w.size);
    }
    w.master_addr = expand_slurm_nodelist(list, name).front();
    w.master_addr_from = fmt::format("{}={} (its first host)", name, list);
  }
  // Every task derives the same port from the job id unless MASTER_PORT says otherwise.
  const int job = int_var(getenv, "SLURM_JOB_ID", 0, 0);
  w.master_port = int_var(getenv, "MASTER_PORT", 20000 + job % 20000, 1);
  if (w.master_port > 65535) throw bad_input("MASTER_PORT={}: expected a port 1–65535", w.master_port);
  return w;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  for (const std::string& item : top_level_items(list, what)) expand_item(item, list, what, out);
  return out;
}

std::string World::describe() const {
  return fmt::format("rank {} of {} (local {} of {} on node {}), rendezvous {}:{}{}", rank, size, local_rank, local_size,
                     node_rank, master_addr, master_port,
                     launcher == "slurm"  ? " (from SLURM's variables)"
                     : agent_store        ? " (the launcher's store)"
                                          : "");
}

World world_from_env(const std::function<const char*(const char*)>& getenv) {
  World w;
  const char* ws = getenv("WORLD_SIZE");
  if (ws == nullptr || *ws == '\0') {
    const char* procid = getenv("SLURM_PROCID");
    if (procid != nullptr && *procid != '\0' && getenv("SLURM_STEP_ID") != nullptr) return slurm_world(getenv);
    return w;  // not launched: one process (an sbatch script outside srun is one process too)
  }
  w.launcher = "torchrun";
  w.size = int_var(getenv, "WORLD_SIZE", 1, 1);
  w.rank = int_var(getenv, "RANK", 0, 0);
  if (w.rank >= w.size) throw bad_input("RANK={} but WORLD_SIZE={}: a rank must be below the world size", w.rank, w.size);
  w.launched = true;
  for (const char* name : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') {
      throw bad_input("WORLD_SIZE={} but {} is not set: start the processes with crucible launch or torchrun (they "
                      "set RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                      w.size, name);
    }
  }
  // LOCAL_RANK is the device index (T2): guessing it from RANK is the multi-node hang.
  const char* local = getenv("LOCAL_RANK");
  if (local == nullptr || *local == '\0') {
    throw bad_input("WORLD_SIZE={} but LOCAL_RANK is not set: the device of a process comes from LOCAL_RANK, never "
                    "from RANK (T2); set it (crucible launch and torchrun do)",
                    w.size);
  }
  w.local_rank = int_var(getenv, "LOCAL_RANK", 0, 0);
  w.local_size = int_var(getenv, "LOCAL_WORLD_SIZE", w.local_rank + 1, 1);
  if (w.local_rank >= w.local_size) {
    throw bad_input("LOCAL_RANK={} but LOCAL_WORLD_SIZE={}: a local rank must be below it", w.local_rank, w.local_size);
  }
  if (w.local_size > w.size) {
    throw bad_input("LOCAL_WORLD_SIZE={} exceeds WORLD_SIZE={}", w.local_size, w.size);
  }
  w.node_rank = int_var(getenv, "GROUP_RANK", w.rank / w.local_size, 0);
  w.master_addr = getenv("MASTER_ADDR");
  w.master_addr_from = "MASTER_ADDR";
  w.master_port = int_var(getenv, "MASTER_PORT", 29500, 1);
  if (w.master_port > 65535) throw bad_input("MASTER_PORT={}: expected a port 1–65535", w.master_port);
  w.restarts = int_var(getenv, "TORCHELASTIC_RESTART_COUNT", 0, 0);
  if (const char* causes = getenv(kRestartCausesEnv); causes != nullptr) w.restart_causes = causes;
  if (const char* id = getenv("TORCHELASTIC_RUN_ID"); id != nullptr) w.run_id = id;
  const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
  w.agent_store = agent != nullptr && std::string(agent) == "True";  // Python's str(True), as torch compares it
  return w;
}

World world_from_env() {
  return world_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

void check_host_resolves(const std::string& host, const std::string& from, double retry_s) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(retry_s * 1000));
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (rc == 0) return;
    if (rc == EAI_AGAIN && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    const std::string why = rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc);
    throw bad_input(
        "rank 0's host \"{}\" (from {}) does not resolve: {}{}. Every rank reaches the rendezvous store there by "
        "this name: check it for a typo, and that /etc/hosts or DNS knows it",
        host, from, why, rc == EAI_AGAIN ? fmt::format(" for {:.0f} s (is DNS down?)", retry_s) : "");
  }
}

void check_devices(const World& world, int device_count) {
  if (device_count <= 0) return;
  if (world.local_size > device_count) {
    throw bad_input("LOCAL_WORLD_SIZE={} processes on this machine but it has {} GPU(s): one process per device "
                    "(law 7, T2); start at most {} per machine",
                    world.local_size, device_count, device_count);
  }
}

}  // namespace crucible::distributed
