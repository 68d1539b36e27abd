// Internal to the launcher (launch.cpp): its signal handling and the rounds in which several
// nodes' launchers move together through the store node 0's launcher serves. Torch-free.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crucible/distributed/launch.h"

namespace crucible::distributed::launch_detail {

using Clock = std::chrono::steady_clock;

// "SIGTERM" (or "signal N").
std::string signal_name(int sig);

// The launcher's signals are blocked while it runs (and taken with sigtimedwait), and the
// previous mask comes back however launch() ends. SIGCHLD is set to its default meanwhile: a
// SIG_IGN inherited from our parent would reap the ranks before waitpid could see how they ended.
class SignalBlock {
 public:
  SignalBlock() {
    sigemptyset(&set_);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set_, s);
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGCHLD, &dfl, &old_chld_);
  }
  ~SignalBlock() {
    // Signals that arrived after the last rank ended have nobody left to go to.
    const timespec zero{0, 0};
    while (::sigtimedwait(&set_, nullptr, &zero) > 0) {
    }
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;
  const sigset_t& set() const { return set_; }
  const sigset_t& old() const { return old_; }

 private:
  sigset_t set_;
  sigset_t old_;
  struct sigaction old_chld_ {};
};

// Waits up to `seconds` for `done` (polled every 100 ms), taking the launcher's signals meanwhile:
// returns 1 when done, 0 on timeout, -sig when a stop signal came.
int wait_for(const std::function<bool()>& done, double seconds, const SignalBlock& signals);

// Several nodes' launchers in step through the store node 0's launcher serves (keys under
// "crucible-launch/"): every round (one start of the group) begins when each node's launcher
// has joined it, ends for every node when one posts a stop (the first stop stands), and ends
// well when every node's ranks have finished. Store calls that fail are retried until
// rdzv_timeout_s has passed without an answer.
class Rendezvous {
 public:
  Rendezvous(const LaunchOptions& o, const LaunchStoreOpener& open, const SignalBlock& signals);

  // Joins round `r` and waits for every node's launcher. Round 0 also checks that every node
  // runs with the same --nproc and --max-restarts and takes node 0's run id. False when the
  // launcher got a stop signal meanwhile.
  bool join(int r, std::string& run_id);

  // Another node's stop of round `r`, if one stands (one store call; nullopt when the store does
  // not answer, until it has not for rdzv_timeout_s: then a {"lost"} stop).
  std::optional<nlohmann::json> poll(int r);

  // Posts this node's stop of round `r`; returns the stop that stands (an earlier one wins).
  // One try unless `patient` (the call after the ranks have ended, when restarts need the
  // nodes to agree): the ranks are being stopped meanwhile, and a launcher asked to stop must not
  // wait for a store that does not answer.
  nlohmann::json post(int r, const nlohmann::json& stop, bool patient);

  // This node's ranks finished round `r`: waits until every node's have, or a stop stands
  // (returned: another node failed after this one finished).
  std::optional<nlohmann::json> finish(int r);

  // The last call: node 0 keeps serving the store until every other node's launcher that joined
  // has left, so none is left asking a store that is gone, or until the others have had the time
  // to stop their ranks (--grace) and read the round's stop.
  void leave();

 private:
  static constexpr double kCallTimeout = 3;  // per call; failed calls are retried (rdzv_timeout_s)

  LaunchStore& store();
  void set(const std::string& key, const std::string& value);
  std::optional<std::string> get(const std::string& key);
  // A failed call drops the connection (a late answer must not be read as the next call's); node
  // 0 serves the store and keeps it.
  void call(const std::function<void()>& f);
  bool has(const std::string& key);
  // The nodes whose key prefix+node is unset; every node when the store does not answer.
  std::vector<int> missing(const std::string& prefix);
  template <typename F>
  auto retry(const char* what, double seconds, F&& f) -> decltype(f());
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  const LaunchOptions& o_;
  const LaunchStoreOpener& open_;
  const SignalBlock& signals_;
  std::string where_;
  std::unique_ptr<LaunchStore> store_;
  std::optional<Clock::time_point> silent_since_;
};

}  // namespace crucible::distributed::launch_detail
