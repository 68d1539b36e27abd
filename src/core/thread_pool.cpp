// ThreadPool: a mutex-guarded deque and a condition variable.
#include "crucible/core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <array>
#include <cstdio>
#include <exception>

namespace crucible {

ThreadPool::ThreadPool(int threads, const char* name) {
  if (threads < 1) threads = 1;
  std::array<char, 16> shown{};  // the kernel keeps 15 characters and the terminator
  std::snprintf(shown.data(), shown.size(), "%s", name);
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this, shown] {
      ::pthread_setname_np(::pthread_self(), shown.data());  // named before its first task; a label only
      run();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // noexcept by contract; an escaping exception reaches std::terminate
  }
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace crucible
