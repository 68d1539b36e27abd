// The test seams that act on every step (environment.h), as a step observer, so the loop holds
// no test code: a slow rank (stragglers) and the step trace (M4).
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/job.h"

namespace crucible::train {
namespace {

class TestSeamObserver final : public StepObserver {
 public:
  TestSeamObserver(std::chrono::microseconds slow, std::FILE* trace, std::FILE* ledger)
      : slow_(slow), trace_(trace, &std::fclose), ledger_(ledger, &std::fclose) {}

  void before_step(const DeviceBatch& batch) override {
    if (slow_.count() > 0) std::this_thread::sleep_for(slow_);  // a straggler
    if (trace_) {
      std::fprintf(trace_.get(), "%lld %lld\n", static_cast<long long>(batch.step),
                   static_cast<long long>(batch.detection() ? batch.min_size : batch.images.size(2)));
    }
    if (ledger_) {  // the sample ledger: which samples each step trained on (issue 37)
      std::fprintf(ledger_.get(), "%lld %lld", static_cast<long long>(batch.step), static_cast<long long>(batch.epoch));
      for (int64_t id : batch.sample_ids) std::fprintf(ledger_.get(), " %lld", static_cast<long long>(id));
      std::fputc('\n', ledger_.get());
      std::fflush(ledger_.get());  // a killed rank's ledger ends at its last step
    }
  }
  void after_update(const StepEvent&) override {}
  std::string describe() const override { return ""; }

 private:
  std::chrono::microseconds slow_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> ledger_;
};

}  // namespace

std::unique_ptr<StepObserver> make_test_seams(const Job& job) {
  const TestSeams& s = job.env.seams;
  std::chrono::microseconds slow{0};
  if (s.slow_rank == job.world.rank && s.slow_rank_ms > 0 && !job.inference) {
    slow = std::chrono::microseconds(static_cast<int64_t>(1000 * s.slow_rank_ms));
    log_warn("{}={}: this rank spends {} ms more on every step (test seam)", testing::kSlowRankEnv, s.slow_rank_text,
             s.slow_rank_ms);
  }
  std::FILE* trace = nullptr;
  std::FILE* ledger = nullptr;
  if (!s.step_trace.empty() && !job.inference) {
    const std::string path = fmt::format("{}.rank{}", s.step_trace, job.world.rank);
    trace = std::fopen(path.c_str(), "a");
    if (trace == nullptr) throw runtime_error("{}={}: cannot open {}", testing::kStepTraceEnv, s.step_trace, path);
    ledger = std::fopen((path + ".samples").c_str(), "a");
    if (ledger == nullptr) {
      std::fclose(trace);
      throw runtime_error("{}={}: cannot open {}.samples", testing::kStepTraceEnv, s.step_trace, path);
    }
  }
  if (slow.count() == 0 && trace == nullptr) return nullptr;
  return std::make_unique<TestSeamObserver>(slow, trace, ledger);
}

}  // namespace crucible::train
