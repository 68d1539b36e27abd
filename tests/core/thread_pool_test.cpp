// ThreadPool: every task runs, on more than one thread, and destruction joins cleanly.
#include "crucible/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>

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

TEST(ThreadPool, AvailableCoresIsPositive) { EXPECT_GE(available_cores(), 1); }

}  // namespace
}  // namespace crucible
