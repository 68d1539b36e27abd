// ThreadPool: every task runs, on more than one thread, and destruction joins cleanly;
// available_cores() follows the calling thread's affinity mask. To add a case: a TEST() here,
// pinning CPUs only inside a thread the test starts (never the test runner's own thread).
#include "crucible/core/thread_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace crucible {
namespace {

TEST(ThreadPool, RunsEveryTaskAndJoins) {
  std::atomic<int> done{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  {
    ThreadPool pool(4);
    for (int i = 0; i < 200; ++i) {
      pool.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
        ++done;
      });
    }
    while (done.load() < 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(done.load(), 200);
  EXPECT_GT(ids.size(), 1u);
}

// Tools that tell the loader's threads from torch's (the resnet bench's input CPU share, top -H)
// read the name; a name longer than the kernel's 15 characters is cut, not refused.
TEST(ThreadPool, WorkersCarryTheirNameFromTheFirstTask) {
  for (const std::string name : {"crucible-load", "a-name-longer-than-fifteen"}) {
    std::mutex mu;
    std::set<std::string> seen;
    std::atomic<int> done{0};
    {
      ThreadPool pool(3, name.c_str());
      for (int i = 0; i < 30; ++i) {
        pool.submit([&] {
          char buf[32] = {};
          ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
          std::lock_guard<std::mutex> lock(mu);
          seen.insert(buf);
          ++done;
        });
      }
      while (done.load() < 30) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(seen, std::set<std::string>{name.substr(0, 15)});
  }
}

// available_cores() on a thread pinned to `cpus` (sched_setaffinity(0) applies to the calling
// thread only), run in a thread of its own so the test process keeps its mask.
int cores_when_pinned_to(const std::vector<int>& cpus) {
  int seen = -1;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      ADD_FAILURE() << "sched_setaffinity failed: " << std::strerror(errno);
      return;
    }
    seen = available_cores();
  });
  t.join();
  return seen;
}

TEST(ThreadPool, AvailableCoresCountsTheAffinityMask) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0) << std::strerror(errno);
  EXPECT_EQ(available_cores(), CPU_COUNT(&mask));
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) allowed.push_back(c);
  }
  ASSERT_FALSE(allowed.empty());
  EXPECT_EQ(cores_when_pinned_to({allowed.back()}), 1);
  if (allowed.size() >= 2) {
    EXPECT_EQ(cores_when_pinned_to({allowed[0], allowed.back()}), 2);
  }
  EXPECT_EQ(available_cores(), CPU_COUNT(&mask));  // the main thread's mask is untouched
}

}  // namespace
}  // namespace crucible
