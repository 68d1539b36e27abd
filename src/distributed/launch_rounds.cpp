// The launchers' rounds (launch_rounds.h): several nodes' launchers in step through node 0's store.
#include "launch_rounds.h"

#include <string.h>

#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"

namespace crucible::distributed::launch_detail {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

int wait_for(const std::function<bool()>& done, double seconds, const SignalBlock& signals) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    if (done()) return 1;
    if (Clock::now() >= until) return 0;
    const timespec ts{0, 100 * 1000 * 1000};
    siginfo_t info;
    const int sig = ::sigtimedwait(&signals.set(), &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) return -sig;
  }
}

template <typename F>
auto Rendezvous::retry(const char* what, double seconds, F&& f) -> decltype(f()) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    try {
      return f();
    } catch (const std::exception& e) {
      if (Clock::now() >= until) {
        throw runtime_error(
            "launch: cannot {} through the launchers' store at {} within {} s (node 0's "
            "launcher is not running, or the network to it failed): {}",
            what, where_, seconds, first_line(e.what()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

Rendezvous::Rendezvous(const LaunchOptions& o, const LaunchStoreOpener& open, const SignalBlock& signals)
    : o_(o), open_(open), signals_(signals) {
  where_ = fmt::format("{}:{}", o.master_addr, o.master_port);
  if (o.node_rank == 0) {
    store_ = open_(o.master_addr, o.master_port, true, kCallTimeout);
    log_info("launch: node 0 serves the launchers' store at {}", where_);
  }
}

bool Rendezvous::join(int r, std::string& run_id) {
  const std::string conf = fmt::format("--nproc {} --max-restarts {}", o_.nproc, o_.max_restarts);
  retry("join", o_.rdzv_timeout_s, [&] {
    if (r == 0) set(fmt::format("config/{}", o_.node_rank), o_.node_rank == 0 ? conf + "\n" + run_id : conf);
    set(fmt::format("round/{}/node/{}", r, o_.node_rank), "1");
    return true;
  });
  const int got =
      wait_for([&] { return missing(fmt::format("round/{}/node/", r)).empty(); }, o_.rdzv_timeout_s, signals_);
  if (got < 0) {
    log_warn("launch: got {} while waiting for the other nodes; not starting", signal_name(-got));
    return false;
  }
  if (got == 0) {
    const std::vector<int> gone = missing(fmt::format("round/{}/node/", r));
    throw runtime_error(
        "launch: node(s) {} did not join round {} of the group within --rdzv-timeout {} s (their "
        "launcher is not running, or cannot reach the store at {})",
        fmt::join(gone, ", "), r, o_.rdzv_timeout_s, where_);
  }
  if (r == 0) {
    for (int k = 0; k < o_.nnodes; ++k) {
      std::string theirs = retry("read the configuration", o_.rdzv_timeout_s,
                                 [&] { return get(fmt::format("config/{}", k)).value_or(""); });
      const size_t nl = theirs.find('\n');
      if (k == 0 && nl != std::string::npos) {
        run_id = theirs.substr(nl + 1);
        theirs.resize(nl);
      }
      if (theirs != conf) {
        throw bad_input(
            "launch: node {} runs with {} and this node (node {}) with {}: every node's launcher needs "
            "the same --nproc and --max-restarts",
            k, theirs, o_.node_rank, conf);
      }
    }
  }
  return true;
}

std::optional<nlohmann::json> Rendezvous::poll(int r) {
  try {
    std::optional<std::string> v = get(fmt::format("round/{}/stop", r));
    silent_since_.reset();
    if (!v) return std::nullopt;
    nlohmann::json stop = nlohmann::json::parse(*v);
    if (stop.value("node", -1) == o_.node_rank && !stop.value("lost", false)) return std::nullopt;  // ours
    return stop;
  } catch (const std::exception& e) {
    if (!silent_since_) silent_since_ = Clock::now();
    if (Clock::now() - *silent_since_ < std::chrono::duration<double>(o_.rdzv_timeout_s)) return std::nullopt;
    return nlohmann::json{{"node", o_.node_rank},
                          {"lost", true},
                          {"code", 1},
                          {"what", fmt::format("the launchers' store at {} has not answered for {} s (node 0's "
                                               "launcher died, or the network to it failed): {}",
                                               where_, o_.rdzv_timeout_s, first_line(e.what()))}};
  }
}

nlohmann::json Rendezvous::post(int r, const nlohmann::json& stop, bool patient) {
  const bool wait = patient && o_.max_restarts > 0 && !stop.value("signalled", false);
  try {
    return retry("tell the other nodes", wait ? o_.rdzv_timeout_s : 0.0, [&] {
      std::string v;
      call([&] { v = store().set_once(fmt::format("crucible-launch/round/{}/stop", r), stop.dump()); });
      return nlohmann::json::parse(v);
    });
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    return stop;
  }
}

std::optional<nlohmann::json> Rendezvous::finish(int r) {
  retry("report the finish", o_.rdzv_timeout_s, [&] {
    set(fmt::format("round/{}/done/{}", r, o_.node_rank), "1");
    return true;
  });
  std::optional<nlohmann::json> stop;
  const int got = wait_for(
      [&] {
        stop = poll(r);
        return stop.has_value() || missing(fmt::format("round/{}/done/", r)).empty();
      },
      o_.rdzv_timeout_s, signals_);
  if (got == 0) {
    log_warn("launch: node(s) {} have not finished {} s after this node's ranks did; leaving",
             fmt::join(missing(fmt::format("round/{}/done/", r)), ", "), o_.rdzv_timeout_s);
  }
  return stop;
}

void Rendezvous::leave() {
  if (o_.node_rank != 0) {
    try {
      set(fmt::format("left/{}", o_.node_rank), "1");
    } catch (const std::exception&) {
    }
    return;
  }
  wait_for(
      [&] {
        for (int k = 1; k < o_.nnodes; ++k) {
          if (has(fmt::format("round/0/node/{}", k)) && !has(fmt::format("left/{}", k))) return false;
        }
        return true;
      },
      o_.grace_seconds + 5, signals_);
}

LaunchStore& Rendezvous::store() {
  if (!store_) store_ = open_(o_.master_addr, o_.master_port, false, kCallTimeout);
  return *store_;
}

void Rendezvous::set(const std::string& key, const std::string& value) {
  call([&] { store().set("crucible-launch/" + key, value); });
}

std::optional<std::string> Rendezvous::get(const std::string& key) {
  std::optional<std::string> v;
  call([&] { v = store().try_get("crucible-launch/" + key); });
  return v;
}

void Rendezvous::call(const std::function<void()>& f) {
  try {
    f();
  } catch (...) {
    if (o_.node_rank != 0) store_.reset();
    throw;
  }
}

bool Rendezvous::has(const std::string& key) {
  try {
    return get(key).has_value();
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<int> Rendezvous::missing(const std::string& prefix) {
  std::vector<int> out;
  for (int k = 0; k < o_.nnodes; ++k) {
    try {
      if (!get(prefix + std::to_string(k))) out.push_back(k);
    } catch (const std::exception&) {
      out.push_back(k);
    }
  }
  return out;
}

}  // namespace crucible::distributed::launch_detail
