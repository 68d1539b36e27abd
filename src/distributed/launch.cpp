// Launcher: fork/exec with a close-on-exec pipe that carries an exec failure's errno back,
// one process group per rank, and a sigtimedwait loop that reaps ranks, passes the
// launcher's signals on and enforces the SIGTERM → SIGKILL grace period.
#include "crucible/distributed/launch.h"
#include "crucible/distributed/world.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "launch_rounds.h"

extern char** environ;

namespace crucible::distributed {
namespace {

using launch_detail::Clock;
using launch_detail::Rendezvous;
using launch_detail::signal_name;
using launch_detail::SignalBlock;
using launch_detail::wait_for;

struct Proc {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
};

void validate(const LaunchOptions& o) {
  if (o.nproc < 1) throw bad_input("launch: --nproc must be >= 1, found {}", o.nproc);
  if (o.nnodes < 1) throw bad_input("launch: --nnodes must be >= 1, found {}", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw bad_input("launch: --node-rank must be in [0, {}) for --nnodes {}, found {}", o.nnodes, o.nnodes,
                    o.node_rank);
  }
  if (static_cast<long long>(o.nproc) * o.nnodes > INT_MAX) {
    throw bad_input("launch: {} nodes × {} processes is too many ranks", o.nnodes, o.nproc);
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    throw bad_input("launch: --master-port must be in [0, 65535] (0: pick a free one), found {}", o.master_port);
  }
  if (o.master_addr.empty()) throw bad_input("launch: --master-addr is empty");
  check_host_resolves(o.master_addr, "launch --master-addr");
  if (o.command.empty() || o.command[0].empty()) {
    throw bad_input("launch: no command to run: give it after `--`, e.g. crucible launch --nproc 2 -- crucible train");
  }
  if (o.max_restarts < 0) throw bad_input("launch: --max-restarts must be >= 0, found {}", o.max_restarts);
  if (!(o.grace_seconds >= 0 && o.grace_seconds <= 86400)) {
    throw bad_input("launch: grace period must be in [0, 86400] s, found {}", o.grace_seconds);
  }
}

// "crucible" as the program means this very binary, whatever PATH holds.
std::string resolve_program(const std::string& name) {
  if (name != "crucible") return name;
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "/proc/self/exe";
  std::string self(buf, static_cast<size_t>(n));
  // Several nodes' launchers run in crucible-torch (they need the store); its sibling `crucible`
  // is the program the command names.
  const std::string torch_suffix = "/crucible-torch";
  if (self.size() > torch_suffix.size() && self.compare(self.size() - torch_suffix.size(), std::string::npos, torch_suffix) == 0) {
    self.resize(self.size() - std::strlen("-torch"));
  }
  return self;
}

bool is_set_by_launcher(const char* entry, const std::vector<std::pair<std::string, std::string>>& vars) {
  const char* eq = std::strchr(entry, '=');
  const size_t len = eq != nullptr ? static_cast<size_t>(eq - entry) : std::strlen(entry);
  for (const auto& v : vars) {
    if (v.first.size() == len && std::strncmp(entry, v.first.data(), len) == 0) return true;
  }
  return false;
}

// The parent's environment with torchrun's variables for one rank on top.
std::vector<std::string> rank_environment(const LaunchOptions& o, int local, int port, const std::string& run_id,
                                          int restart, const std::string& causes, const std::string& progress_dir) {
  const int rank = o.node_rank * o.nproc + local, world = o.nnodes * o.nproc;
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", run_id},
      // Several nodes: the ranks use the launchers' store (see Rendezvous).
      {"TORCHELASTIC_USE_AGENT_STORE", o.nnodes > 1 ? "True" : "False"},
      {kRestartCausesEnv, causes},
      {kProgressDirEnv, progress_dir},
  };
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!is_set_by_launcher(*e, vars)) env.emplace_back(*e);
  }
  for (const auto& v : vars) env.push_back(v.first + "=" + v.second);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// A rank's end in words: "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    // 127 is how a shell (sh -c, a wrapper script) says it could not find a command.
    return fmt::format("exited with code {}{}", WEXITSTATUS(status),
                       WEXITSTATUS(status) == 127 ? " (command not found?)" : "");
  }
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), signal_name(WTERMSIG(status)));
  }
  return fmt::format("ended with wait status {}", status);
}

// Sends `sig` to the process group of every running rank (its own and any children it
// started, e.g. a shell's); ranks already gone are skipped.
void signal_ranks(const std::vector<Proc>& procs, int sig) {
  for (const auto& p : procs) {
    if (p.running) ::kill(-p.pid, sig);
  }
}

}  // namespace

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw runtime_error("launch: cannot open a socket to find a free port: {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw runtime_error("launch: cannot find a free port on 127.0.0.1: {}", errno_text(err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// The last step a rank wrote to its progress file (kProgressDirEnv), or -1.
int64_t last_step(const std::string& progress_dir, int rank) {
  const int fd = ::open(fmt::format("{}/rank{}", progress_dir, rank).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int64_t step = -1;
  if (::pread(fd, &step, sizeof step, 0) != static_cast<ssize_t>(sizeof step)) step = -1;
  ::close(fd);
  return step;
}

// How one start of the group ended.
struct GroupEnd {
  int code = 0;            // what launch returns for it: the first failing rank's exit code, or a
                           // later one's 2 or 3 (its own finding: the first was its consequence)
  bool signalled = false;  // the launcher itself was asked to stop: never restarted
  int rank = -1;           // the first rank that failed, -1 when none did
  std::string what;        // how it ended, in words
  int64_t step = -1;       // the training step it was at (its progress file), -1 unknown
  // Several nodes: another node's launcher stopped the round (`stop` says why; see Rendezvous).
  bool remote = false;
  nlohmann::json stop;
};

// A round's stop as the launchers share it: {"node", "rank", "code", "what", "step"}, or
// {"node", "signalled": true, "what"} when a launcher was asked to stop, or {"node", "lost": true,
// "what"} when a node's launcher lost the store.
nlohmann::json stop_of(const LaunchOptions& o, const GroupEnd& end) {
  return {{"node", o.node_rank},
          {"rank", end.rank},
          {"code", end.code},
          {"what", end.what},
          {"step", end.step >= 0 ? nlohmann::json(end.step) : nlohmann::json(nullptr)}};
}

// "rank 3 was killed by signal 9 (SIGKILL) at step 40 on node 1".
std::string describe_stop(const nlohmann::json& stop, const LaunchOptions& o) {
  const std::string where = o.nnodes > 1 ? fmt::format(" on node {}", stop.value("node", 0)) : "";
  if (stop.value("signalled", false) || stop.value("lost", false)) return stop.value("what", std::string("stopped"));
  if (stop.value("rank", -1) < 0) return stop.value("what", std::string("could not be started")) + where;
  return fmt::format("rank {} {}{}{}", stop.value("rank", -1), stop.value("what", std::string()),
                     stop["step"].is_number() ? fmt::format(" at step {}", stop["step"].get<int64_t>()) : "", where);
}

// What run_group asks of the other nodes' launchers (unset on one node).
struct RemoteHooks {
  std::function<std::optional<nlohmann::json>()> poll;        // another node's stop of this round, if any
  std::function<void(const nlohmann::json& stop)> post;       // this node's stop, for the others
};

// Starts this node's ranks once and waits for all of them (see launch()).
GroupEnd run_group(const LaunchOptions& o, int port, const std::string& run_id, int restart,
                   const std::string& causes, const std::string& progress_dir, const SignalBlock& signals,
                   const RemoteHooks& remote) {
  const int world = o.nnodes * o.nproc;
  GroupEnd end;
  // Everything the children need is built before the first fork: between fork and exec a
  // child may only make async-signal-safe calls (another thread may hold the malloc lock).
  const std::string program = resolve_program(o.command[0]);
  std::vector<std::string> args = o.command;
  std::vector<char*> argv = pointers(args);
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> envps;
  for (int local = 0; local < o.nproc; ++local) {
    envs.push_back(rank_environment(o, local, port, run_id, restart, causes, progress_dir));
  }
  for (auto& e : envs) envps.push_back(pointers(e));

  // A rank that fails before it writes its progress must not be placed at its predecessor's step.
  for (int local = 0; local < o.nproc; ++local) {
    ::unlink(fmt::format("{}/rank{}", progress_dir, o.node_rank * o.nproc + local).c_str());
  }
  const pid_t launcher = ::getpid();
  std::vector<Proc> procs;
  int result = 0;        // the exit code to return: the first failing rank's
  bool stopping = false;  // SIGTERM was sent (a rank failed, or the launcher was signalled)
  Clock::time_point kill_at{};
  bool killed = false;

  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
  auto stop_others = [&] {
    if (stopping) return;
    stopping = true;
    signal_ranks(procs, SIGTERM);
    kill_at = Clock::now() + grace;
  };

  for (int local = 0; local < o.nproc && !stopping; ++local) {
    const int rank = o.node_rank * o.nproc + local;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      log_error("launch: cannot start rank {}: pipe: {}; stopping the other ranks", rank, errno_text(errno));
      result = 1;
      stop_others();
      break;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      log_error("launch: cannot start rank {}: fork: {}; stopping the other ranks", rank, errno_text(errno));
      ::close(fds[0]);
      ::close(fds[1]);
      result = 1;
      stop_others();
      break;
    }
    if (pid == 0) {
      // The child. Its own process group: a terminal's Ctrl-C reaches the launcher only, which
      // passes it on once. SIGTERM when the launcher dies, so no rank outlives a killed launcher
      // (and if it already died before prctl, stop now).
      ::close(fds[0]);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::pthread_sigmask(SIG_SETMASK, &signals.old(), nullptr);
      environ = envps[static_cast<size_t>(local)].data();
      ::execvp(program.c_str(), argv.data());
      const int err = errno;
      ssize_t ignored = ::write(fds[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(err == ENOENT ? 127 : 126);
    }
    ::setpgid(pid, pid);  // also here, so the group exists whichever process runs first
    ::close(fds[1]);
    procs.push_back(Proc{rank, pid, true});
    int err = 0;
    ssize_t got;
    do {
      got = ::read(fds[0], &err, sizeof(err));  // EOF: exec succeeded and closed the pipe
    } while (got < 0 && errno == EINTR);
    ::close(fds[0]);
    if (got == static_cast<ssize_t>(sizeof(err))) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      procs.back().running = false;
      log_error("launch: rank {} could not run `{}`: {}{}", rank, o.command[0], errno_text(err),
                err == ENOENT ? " (command not found)" : "");
      result = err == ENOENT ? 127 : 126;
      stop_others();
    }
  }

  if (stopping && remote.post) {
    end.code = result;
    end.what = "could not be started";
    remote.post(stop_of(o, end));
  }
  if (!stopping) {
    std::string pids;
    for (const auto& p : procs) pids += fmt::format("{}rank {} pid {}", pids.empty() ? "" : ", ", p.rank, p.pid);
    const int first = o.node_rank * o.nproc, last = first + o.nproc - 1;
    log_info("launch: {} process{} (rank{} of {}, node {} of {}), master {}:{}: {}", o.nproc, o.nproc == 1 ? "" : "es",
             first == last ? fmt::format(" {}", first) : fmt::format("s {}–{}", first, last), world, o.node_rank,
             o.nnodes, o.master_addr, port, pids);
  }

  auto any_running = [&] { return std::any_of(procs.begin(), procs.end(), [](const Proc& p) { return p.running; }); };
  while (any_running()) {
    // Reap whatever ended (only our own children: others of this process are not ours to wait for).
    for (auto& p : procs) {
      if (!p.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(p.pid, &status, WNOHANG);
      if (r < 0 && errno == ECHILD) {
        // Reaped elsewhere (another thread's waitpid(-1)): its end is unknown, so a failure.
        log_warn("launch: rank {} (pid {}) was reaped by someone else; its exit status is unknown", p.rank, p.pid);
        status = W_EXITCODE(1, 0);  // counted as exit code 1
      } else if (r != p.pid) {
        continue;
      }
      p.running = false;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok) continue;
      if (stopping) {
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if ((code == 2 || code == 3) && result != 2 && result != 3 && end.rank >= 0 && !end.remote &&
            !end.signalled) {
          // Bad input or divergence is a rank's own finding, never what SIGTERM does: the cause,
          // which the first failure (a peer that lost its connection to this rank) followed from.
          const int64_t step = last_step(progress_dir, p.rank);
          log_error("launch: rank {} (pid {}) {}{}: the cause of rank {}'s failure", p.rank, p.pid,
                    describe_status(status), step >= 0 ? fmt::format(" at step {}", step) : "", end.rank);
          end.rank = p.rank;
          end.what = describe_status(status);
          end.step = step;
          result = code;
          continue;
        }
        log_info("launch: rank {} (pid {}), being stopped, {}", p.rank, p.pid, describe_status(status));
        if (result == 0) result = code;
        continue;
      }
      end.rank = p.rank;
      end.what = describe_status(status);
      end.step = last_step(progress_dir, p.rank);
      log_error("launch: rank {} (pid {}) {}{}{}", p.rank, p.pid, end.what,
                end.step >= 0 ? fmt::format(" at step {}", end.step) : "",
                any_running() ? "; stopping the other ranks" : "");
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      stop_others();
      if (remote.post) {
        end.code = result;
        remote.post(stop_of(o, end));
      }
    }
    if (!stopping && remote.poll) {
      if (std::optional<nlohmann::json> stop = remote.poll()) {
        log_error("launch: {}; stopping this node's ranks", describe_stop(*stop, o));
        end.remote = true;
        end.stop = *stop;
        result = stop->value("code", 1);
        stop_others();
      }
    }
    if (!any_running()) break;
    if (stopping && !killed && Clock::now() >= kill_at) {
      std::string late;
      for (const auto& p : procs) {
        if (p.running) late += fmt::format("{}{}", late.empty() ? "" : ", ", p.rank);
      }
      log_warn("launch: rank(s) {} still running {} s after SIGTERM; sending SIGKILL", late, o.grace_seconds);
      signal_ranks(procs, SIGKILL);
      killed = true;
    }
    // Sleep until a child ends or a signal comes, at most 100 ms (and not past the grace deadline).
    auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::milliseconds(100));
    if (stopping && !killed) {
      wait = std::min(wait, std::max(std::chrono::nanoseconds(0),
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(kill_at - Clock::now())));
    }
    const timespec ts{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
    siginfo_t info;
    const int sig = ::sigtimedwait(&signals.set(), &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      // The launcher's own stop request: every rank gets it once (they are not in the
      // terminal's process group), and the grace period starts.
      log_warn("launch: got {}; passing it to every rank", signal_name(sig));
      if (!end.signalled && remote.post) {
        remote.post({{"node", o.node_rank},
                     {"signalled", true},
                     {"what", fmt::format("the launcher on node {} got {}", o.node_rank, signal_name(sig))}});
      }
      end.signalled = true;
      signal_ranks(procs, sig);
      if (!stopping) {
        stopping = true;
        kill_at = Clock::now() + grace;
      }
    }
  }
  if (stopping) {
    // Whatever a stopped rank left behind in its process group (a shell's background job) goes too.
    for (const auto& p : procs) ::kill(-p.pid, SIGKILL);
  }
  end.code = result;
  if (result != 0 && end.rank < 0) end.what = "could not be started";
  return end;
}

// Whether the round that ended with `stop` (see stop_of) is restarted; when not, says why.
// `previous_step` is the step of the last restarted failure (-1: none).
bool restarts_after(const nlohmann::json& stop, int restart, int64_t previous_step, const LaunchOptions& o) {
  if (stop.value("signalled", false) || stop.value("lost", false)) {
    log_error("launch: not restarting: {}", describe_stop(stop, o));
    return false;
  }
  if (o.max_restarts == 0 || stop.value("rank", -1) < 0) return false;
  const std::string failure = describe_stop(stop, o);
  const int code = stop.value("code", 1);
  const int64_t step = stop["step"].is_number() ? stop["step"].get<int64_t>() : -1;
  if (restart >= o.max_restarts) {
    log_error("launch: not restarting: all {} restart(s) of --max-restarts are used; the last failure: {}",
              o.max_restarts, failure);
    return false;
  }
  if (code == 2 || code == 3) {
    log_error("launch: not restarting: {}, {} which a restart would only repeat", failure,
              code == 2 ? "bad input or usage (exit code 2)," : "training diverged (exit code 3),");
    return false;
  }
  if (step >= 0 && step == previous_step) {
    log_error("launch: not restarting: {}, where the last failure happened too (a failure that repeats at the same "
              "step is not a fault a restart fixes)",
              failure);
    return false;
  }
  return true;
}

}  // namespace

int launch(const LaunchOptions& o, const LaunchStoreOpener& open_store) {
  validate(o);
  if (o.nnodes > 1 && !open_store) {
    throw runtime_error("launch: --nnodes {} needs the launchers' store, which crucible-torch opens (run it through "
                        "the crucible program)",
                        o.nnodes);
  }
  std::string run_id = fmt::format(
      "crucible-{}-{}", ::getpid(), std::chrono::system_clock::now().time_since_epoch().count());
  // Each rank writes the step it is at into <progress>/rank<R> (crucible train does; another
  // program need not), so a failure can be placed and a repeat at the same step recognised.
  std::string progress = fmt::format("{}/crucible-launch-XXXXXX", std::filesystem::temp_directory_path().string());
  if (::mkdtemp(progress.data()) == nullptr) {
    throw runtime_error("launch: cannot create a folder under {}: {}", std::filesystem::temp_directory_path().string(),
                        errno_text(errno));
  }
  struct RemoveAfter {
    std::string path;
    ~RemoveAfter() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_progress{progress};

  SignalBlock signals;  // before the forks (and the store's threads): a Ctrl-C during start-up waits for the loop
  // Several nodes: the launchers meet in node 0's store at master_addr:master_port, and the ranks
  // use that store too (TORCHELASTIC_USE_AGENT_STORE), as under torchrun.
  std::unique_ptr<Rendezvous> rdzv;
  if (o.nnodes > 1) {
    rdzv = std::make_unique<Rendezvous>(o, open_store, signals);
  }
  // A launcher that gives up (a timeout, a refusal) still lets the others read why before node 0's
  // store goes (Rendezvous::leave).
  auto rounds = [&]() -> int {
    nlohmann::json causes = nlohmann::json::array();
    int64_t previous_step = -1;
    for (int restart = 0;; ++restart) {
      if (rdzv && !rdzv->join(restart, run_id)) return 1;
      // One machine: a fresh port per start (the last one's store may still hold it); several: the
      // launchers' store, whose keys each group keeps under its own prefix.
      const int port = o.master_port != 0 ? o.master_port : o.nnodes > 1 ? 29500 : free_port();
      RemoteHooks hooks;
      if (rdzv) {
        hooks.poll = [&] { return rdzv->poll(restart); };
        hooks.post = [&](const nlohmann::json& stop) { rdzv->post(restart, stop, /*patient=*/false); };
      }
      const GroupEnd end = run_group(o, port, run_id, restart, causes.dump(), progress, signals, hooks);
      auto give_up = [&](int c) {
        if (rdzv) rdzv->leave();
        return c;
      };
      if (end.signalled) return give_up(end.code);  // the others heard it from run_group
      // The round's outcome, the same on every node: the stop that stands.
      nlohmann::json stop = stop_of(o, end);
      if (rdzv) {
        if (end.code == 0 && !end.remote) {
          std::optional<nlohmann::json> late = rdzv->finish(restart);
          if (!late) {
            rdzv->leave();
            return 0;
          }
          stop = *late;
          log_error("launch: {} after this node's ranks finished", describe_stop(stop, o));
        } else {
          stop = rdzv->post(restart, end.remote ? end.stop : stop, /*patient=*/true);
        }
      } else if (end.code == 0 || end.rank < 0) {
        return end.code;
      }
      const int code = stop.value("code", 1);
      const int64_t step = stop["step"].is_number() ? stop["step"].get<int64_t>() : -1;
      if (!restarts_after(stop, restart, previous_step, o)) return give_up(code);
      previous_step = step;
      nlohmann::json cause = {{"restart", restart + 1},
                              {"rank", stop.value("rank", -1)},
                              {"cause", stop.value("what", std::string())},
                              {"step", step >= 0 ? nlohmann::json(step) : nlohmann::json(nullptr)}};
      if (o.nnodes > 1) cause["node"] = stop.value("node", 0);
      causes.push_back(cause);
      // Back off (1, 2, 4, … s, at most 30): a failure of the network or of another node's
      // launcher takes a while to clear, and a group restarted at once would fail again at its
      // rendezvous and use up the restarts.
      const int delay = std::min(1 << std::min(restart, 5), 30);
      log_warn("launch: restart {} of {} in {} s after {}: every rank{} starts again and resumes from the newest "
               "checkpoint that verifies",
               restart + 1, o.max_restarts, delay, describe_stop(stop, o), o.nnodes > 1 ? " on every node" : "");
      const int got = wait_for([] { return false; }, delay, signals);
      if (got < 0) {
        log_warn("launch: got {} while waiting to restart; not restarting", signal_name(-got));
        return give_up(code);
      }
    }
  };
  try {
    return rounds();
  } catch (...) {
    if (rdzv) rdzv->leave();
    throw;
  }
}

}  // namespace crucible::distributed
