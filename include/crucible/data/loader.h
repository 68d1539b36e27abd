// The Loader turns sample indices into batches on a persistent thread pool (D8). Each batch
// is one task: read pixels, augment on uint8 with the sample's own RNG stream (seed, epoch,
// index), collate into [batch, height, width, channels] uint8. Batches come out in sampler
// order, whatever the thread timing, so a batch's content is identical for any thread count
// (law 1). At most `prefetch` batches are built or waiting, which bounds memory (D10).
// Not thread-safe: one consumer thread calls start_epoch() and next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "crucible/data/image.h"
#include "crucible/data/sampler.h"
#include "crucible/data/source.h"

namespace crucible {
class ThreadPool;
}

namespace crucible::data {

struct LoaderOptions {
  int64_t batch_size = 256;
  bool drop_last = false;     // drop a final partial batch
  int threads = 1;            // worker threads (>= 1)
  int prefetch = 4;           // batches built ahead of the consumer (>= 1)
  float hflip = 0.0f;         // probability of a horizontal flip per sample
  uint64_t augment_seed = 0;  // derive_seed(run seed, RngStream::kAugment)
};

struct Batch {
  int64_t epoch = 0;
  int64_t index = 0;                  // batch number within the epoch
  ImageSpec spec;                     // per-sample shape and conventions
  std::vector<int64_t> sample_ids;    // source indices, in batch order
  std::vector<uint8_t> pixels;        // [size, height, width, channels] uint8
  std::vector<int64_t> labels;        // [size]
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

class Loader {
 public:
  Loader(std::shared_ptr<const Source> source, Sampler sampler, LoaderOptions options);
  // Cancels batches in flight and joins the pool.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  const Source& source() const { return *source_; }
  const LoaderOptions& options() const { return options_; }

  // Serves epoch `epoch` starting at batch `first_batch` (a resumed position); batches of a
  // previous epoch still in flight are discarded.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  // The next batch of the current epoch, or nullopt after the last. Blocks until it is built.
  // A worker's exception is rethrown here.
  std::optional<Batch> next();

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  void schedule_locked();  // requires mu_
  Batch build(int64_t epoch, int64_t index, const std::vector<int64_t>& order) const;
  void cancel_and_wait();

  std::shared_ptr<const Source> source_;
  Sampler sampler_;
  LoaderOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;                          // guarded by mu_; bumped to cancel
  int64_t epoch_ = -1;                               // guarded by mu_
  std::shared_ptr<const std::vector<int64_t>> order_;  // guarded by mu_
  int64_t next_schedule_ = 0;                        // guarded by mu_
  int64_t next_return_ = 0;                          // consumer only
  int in_flight_ = 0;                                // guarded by mu_: scheduled, not yet stored
  std::map<int64_t, Slot> ready_;                    // guarded by mu_
  std::unique_ptr<ThreadPool> pool_;                 // last: destroyed first
};

}  // namespace crucible::data
