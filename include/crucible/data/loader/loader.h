// The Loader turns sample indices into batches on a persistent thread pool (D8). Each batch
// is one task: every sample goes through the SamplePipeline straight into its slot of the
// batch buffer ([batch, height, width, channels] uint8; pinned host memory when the caller's
// allocator gives it, D9). Batches come out in sampler order whatever the thread timing, so a
// batch's content is identical for any thread count (law 1). At most `prefetch` batches are
// built or waiting, which bounds memory (D10). A bad sample fails the run naming it, or under
// the "skip" policy is left out of its batch, counted and named in the report (D5).
// Not thread-safe: one consumer thread calls start_epoch() and next().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "crucible/data/image/image.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/samplers/sampler.h"

namespace crucible {
class ThreadPool;
}

namespace crucible::data {

// Batch pixel memory: the heap by default, pinned host memory when the trainer's allocator
// provides it (D9). Move-only view plus the owner of the bytes.
class PixelBuffer {
 public:
  PixelBuffer() = default;
  PixelBuffer(uint8_t* data, size_t capacity, std::shared_ptr<void> owner)
      : data_(data), capacity_(capacity), size_(capacity), owner_(std::move(owner)) {}
  static PixelBuffer heap(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }  // bytes in use (≤ capacity after skipped samples)
  void resize(size_t bytes) { size_ = bytes <= capacity_ ? bytes : capacity_; }
  bool operator==(const PixelBuffer& o) const;
  bool operator!=(const PixelBuffer& o) const { return !(*this == o); }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;
};

enum class BadSamplePolicy { kFail, kSkip };
const char* bad_sample_policy_name(BadSamplePolicy policy);  // "fail" | "skip"

struct LoaderOptions {
  int64_t batch_size = 256;
  bool drop_last = false;   // drop a final partial batch
  int threads = 1;          // worker threads (>= 1)
  int prefetch = 4;         // batches built ahead of the consumer (>= 1)
  BadSamplePolicy bad_samples = BadSamplePolicy::kFail;
  bool channels_first = false;  // collate [batch, channels, height, width] instead of NHWC (pixels;
                                // float features are always [batch, channels, height, width])
  // Allocates a batch's pixel memory (default: the heap). Called from worker threads.
  std::function<PixelBuffer(size_t bytes)> allocate;
  // Test seam: each sample takes this much longer to read (a slow disk, an input-bound run).
  std::chrono::microseconds sample_delay{0};
};

struct Batch {
  int64_t epoch = 0;
  int64_t index = 0;                 // batch number within the epoch
  ImageSpec spec;                    // per-sample shape and conventions
  std::vector<int64_t> sample_ids;   // source indices, in batch order (skipped ones removed)
  std::vector<int64_t> copies;       // which copy of its sample each is (Sampler::epoch_copies); empty: all first
  bool channels_first = false;       // pixels are [size, channels, height, width]
  PixelBuffer pixels;                // [size, height, width, channels] uint8 (or NCHW, above);
                                     // features: [size, channels, height, width] float32
  std::vector<int64_t> labels;       // [size] class indices (-1 for multi-label data)
  int64_t target_width = 0;          // multi-label data: targets per sample (the classes); else 0
  std::vector<float> targets;        // [size, target_width] 0–1 targets (empty when target_width is 0)
  std::vector<std::string> skipped;  // "name: reason" of samples left out (skip policy)
  // Detection (SamplePipeline::detection; labels are -1): the batch's images padded to `spec`'s
  // height and width (collate.h), each image's own [height, width] before padding ([size, 2]),
  // its id in the source ([size]; COCO's image id), and the boxes packed: [total, 4] xyxy pixels,
  // their labels and crowd flags ([total]), and where each image's boxes begin ([size + 1]).
  bool detection = false;
  std::vector<int64_t> image_sizes, image_ids;
  std::vector<float> boxes;
  std::vector<int64_t> box_labels;
  std::vector<uint8_t> box_crowd;
  std::vector<int64_t> box_offsets;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

class Loader {
 public:
  // Throws bad_input for invalid options, and (D6) when `threads` readers would need more open
  // files than `ulimit -n` allows, saying what to raise it to.
  Loader(std::shared_ptr<const SamplePipeline> pipeline, std::shared_ptr<const Sampler> sampler,
         LoaderOptions options);
  Loader(std::shared_ptr<const SamplePipeline> pipeline, const DistributedSampler& sampler, LoaderOptions options)
      : Loader(std::move(pipeline), std::make_shared<const DistributedSampler>(sampler), std::move(options)) {}
  // Cancels batches in flight and joins the pool.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches of this rank's share of an epoch (sampler().num_samples() indices).
  int64_t batches_per_epoch() const;
  const SamplePipeline& pipeline() const { return *pipeline_; }
  const Sampler& sampler() const { return *sampler_; }
  const LoaderOptions& options() const { return options_; }

  // Serves epoch `epoch` starting at batch `first_batch` (a resumed position); batches of a
  // previous epoch still in flight are discarded.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  // The next batch of the current epoch, or nullopt after the last. Blocks until it is built.
  // A worker's exception (a bad sample under "fail") is rethrown here.
  std::optional<Batch> next();

  // Samples skipped so far (skip policy), in the order their batches were returned.
  int64_t skipped_count() const { return skipped_count_; }
  const std::vector<std::string>& skipped_names() const { return skipped_names_; }  // first 1000
  // Worker time spent building batches so far, summed over the threads (how busy the loader
  // is: this over threads × wall time).
  double busy_seconds() const { return static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) * 1e-9; }
  // D11: wall seconds this loader has been serving epochs: from each start_epoch() to the
  // next() that ends the epoch (or pause_clock(), or the next start_epoch()), summed; the time
  // its reads are spread over.
  double active_seconds() const;
  void pause_clock();

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  void schedule_locked();  // requires mu_
  Batch build(int64_t epoch, int64_t index, const std::vector<int64_t>& order, const std::vector<int64_t>& copies) const;
  Batch build_detection(int64_t epoch, int64_t index, const std::vector<int64_t>& order,
                        const std::vector<int64_t>& copies) const;
  void cancel_and_wait();

  std::shared_ptr<const SamplePipeline> pipeline_;
  std::shared_ptr<const Sampler> sampler_;
  LoaderOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;                            // guarded by mu_; bumped to cancel
  int64_t epoch_ = -1;                                 // guarded by mu_
  std::shared_ptr<const std::vector<int64_t>> order_;  // guarded by mu_
  std::shared_ptr<const std::vector<int64_t>> copies_;  // guarded by mu_; empty: all first copies
  int64_t next_schedule_ = 0;                          // guarded by mu_
  int64_t next_return_ = 0;                            // consumer only
  int in_flight_ = 0;                                  // guarded by mu_: scheduled, not yet stored
  std::map<int64_t, Slot> ready_;                      // guarded by mu_
  int64_t skipped_count_ = 0;                          // consumer only
  std::vector<std::string> skipped_names_;             // consumer only
  std::atomic<int64_t> busy_ns_{0};                    // workers' time in build()
  std::optional<std::chrono::steady_clock::time_point> serving_since_;  // consumer only: the open window
  double served_seconds_ = 0;                          // consumer only: closed windows
  std::unique_ptr<ThreadPool> pool_;                   // last: destroyed first
};

// The first `n` samples of a pipeline (cycling when it has fewer) as one NHWC batch of epoch 0,
// on the calling thread: for measuring a step (precision auto, tune batch), not for training.
Batch sample_batch(const SamplePipeline& pipeline, int64_t n);

// D10: what measure_loader_threads saw — samples/s with 1..max threads — and the count it
// picked: the smallest t whose rate is at least 90% of the best rate.
struct LoaderThreadChoice {
  int threads = 1;
  std::vector<double> samples_per_s;  // [t - 1]: measured with t threads; empty when not measured
  // "3 thread(s) (measured samples/s with 1: 410/s, 2: 790/s, 3: 1150/s, 4: 1180/s)".
  std::string describe() const;
  // The choice these rates make (the rule above); `samples_per_s` must not be empty.
  static LoaderThreadChoice from_rates(std::vector<double> samples_per_s);
};

// Runs `pipeline` on 1, 2, ..., max_threads threads for 300 ms each (three interleaved rounds
// of 100 ms, keeping each count's best round: other load only slows a round down) and picks
// the count. With max_threads ≤ 1 or an empty pipeline nothing is measured and the choice is 1.
LoaderThreadChoice measure_loader_threads(const SamplePipeline& pipeline, int max_threads);

// D6: the open files a loader of `threads` readers over `pipeline` needs, with the ~64 the rest of
// the process holds (stdio, logs, checkpoints, libraries); 0 when the readers hold no files.
int descriptors_needed(const SamplePipeline& pipeline, int threads);

// measure_loader_threads(...).threads; `report` gets describe() when something was measured.
int choose_loader_threads(const SamplePipeline& pipeline, int max_threads, std::string* report = nullptr);

}  // namespace crucible::data
