// A fixed set of worker threads that lives as long as its owner (D8: never re-created per
// epoch). Tasks run in submission order of pickup, concurrently. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace crucible {

class ThreadPool {
 public:
  // Starts `threads` (>= 1) workers, named `name` (at most 15 characters shown) so that
  // `top -H`, perf and /proc/PID/task/*/comm tell them from torch's compute threads.
  explicit ThreadPool(int threads, const char* name = "crucible-pool");
  // Drops tasks not yet started, waits for running ones, joins every worker.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; never blocks. A task must not throw: catch and hand the exception to the
  // consumer (a task that throws terminates the program, as a bug).
  void submit(std::function<void()> task);

  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> workers_;
};

// Cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

}  // namespace crucible
