// Loader: ordered, bounded, cancellable batch building on a persistent ThreadPool.
#include "crucible/data/loader/loader.h"

#include "crucible/data/loader/collate.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/thread_pool.h"

namespace crucible::data {

PixelBuffer PixelBuffer::heap(size_t bytes) {
  std::shared_ptr<uint8_t> mem(new uint8_t[bytes > 0 ? bytes : 1], std::default_delete<uint8_t[]>());
  return PixelBuffer(mem.get(), bytes, mem);
}

bool PixelBuffer::operator==(const PixelBuffer& o) const {
  return size_ == o.size_ && (size_ == 0 || std::memcmp(data_, o.data_, size_) == 0);
}

namespace {

// Batch buffers recycled between batches: a batch of 224×224 RGB crops is ~38 MB, above
// glibc's mmap threshold, so a fresh one per batch was an mmap, ~9,400 page faults and an
// munmap each time. Buffers return here when their Batch dies (if the pool still exists) and
// at most `keep` wait, which with prefetch bounds the memory held.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t keep) : keep_(keep) {}

  PixelBuffer get(size_t bytes) {
    uint8_t* mem = nullptr;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].second >= bytes) {
          mem = free_[i].first;
          capacity = free_[i].second;
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
    if (mem == nullptr) {
      capacity = bytes > 0 ? bytes : 1;
      mem = new uint8_t[capacity];
    }
    std::weak_ptr<BufferPool> pool = shared_from_this();
    std::shared_ptr<uint8_t> owner(mem, [pool, capacity](uint8_t* p) {
      if (auto alive = pool.lock()) {
        if (alive->put(p, capacity)) return;
      }
      delete[] p;
    });
    PixelBuffer b(mem, capacity, owner);
    b.resize(bytes);
    return b;
  }

  ~BufferPool() {
    for (auto& f : free_) delete[] f.first;
  }

 private:
  bool put(uint8_t* p, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() >= keep_) return false;
    free_.emplace_back(p, capacity);
    return true;
  }

  std::mutex mu_;
  size_t keep_;
  std::vector<std::pair<uint8_t*, size_t>> free_;  // guarded by mu_
};

}  // namespace

const char* bad_sample_policy_name(BadSamplePolicy policy) {
  return policy == BadSamplePolicy::kSkip ? "skip" : "fail";
}

int descriptors_needed(const SamplePipeline& pipeline, int threads) {
  const int files = pipeline.files_needed(threads);
  return files > 0 ? files + 64 : 0;  // + stdio, logs, checkpoints, libraries
}

Loader::Loader(std::shared_ptr<const SamplePipeline> pipeline, std::shared_ptr<const Sampler> sampler,
               LoaderOptions options)
    : pipeline_(std::move(pipeline)), sampler_(std::move(sampler)), options_(std::move(options)) {
  if (options_.batch_size < 1) throw bad_input("loader: batch_size must be >= 1, found {}", options_.batch_size);
  if (options_.threads < 1) throw bad_input("loader: threads must be >= 1, found {}", options_.threads);
  if (options_.prefetch < 1) throw bad_input("loader: prefetch must be >= 1, found {}", options_.prefetch);
  if (sampler_->size() != pipeline_->size()) throw std::logic_error("Loader: sampler size differs from the pipeline's");
  // D6: compare the descriptors the readers need with the process limit, before any work.
  struct rlimit lim {};
  const int need = descriptors_needed(*pipeline_, options_.threads);
  if (need > 0 && ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    if (static_cast<rlim_t>(need) > lim.rlim_cur) {
      throw bad_input("the loader needs about {} open files ({} threads reading {}) but `ulimit -n` is {}: raise it "
                      "(ulimit -n {}) or lower data.threads",
                      need, options_.threads, pipeline_->describe(), lim.rlim_cur, need);
    }
  }
  if (!options_.allocate) {
    auto pool = std::make_shared<BufferPool>(static_cast<size_t>(options_.prefetch) + 2);
    options_.allocate = [pool](size_t bytes) { return pool->get(bytes); };
  }
  pool_ = std::make_unique<ThreadPool>(options_.threads, "crucible-load");
}

Loader::~Loader() {
  cancel_and_wait();
  pool_.reset();
}

int64_t Loader::batches_per_epoch() const {
  // This rank's share of an epoch (X1: a sharded sampler visits num_samples, not size()).
  const int64_t n = sampler_->num_samples(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void Loader::cancel_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  ++generation_;
  cv_.wait(lock, [this] { return in_flight_ == 0; });
  ready_.clear();
}

double Loader::active_seconds() const {
  return served_seconds_ +
         (serving_since_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *serving_since_).count()
                         : 0.0);
}

void Loader::pause_clock() {
  served_seconds_ = active_seconds();
  serving_since_.reset();
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  pause_clock();
  serving_since_ = std::chrono::steady_clock::now();
  auto order = std::make_shared<const std::vector<int64_t>>(sampler_->epoch_order(epoch));
  auto copies = std::make_shared<const std::vector<int64_t>>(sampler_->epoch_copies(epoch));
  if (!copies->empty() && copies->size() != order->size()) {
    throw std::logic_error(fmt::format("sampler: {} copy numbers for {} positions", copies->size(), order->size()));
  }
  cancel_and_wait();
  std::lock_guard<std::mutex> lock(mu_);
  epoch_ = epoch;
  order_ = std::move(order);
  copies_ = std::move(copies);
  next_schedule_ = std::clamp<int64_t>(first_batch, 0, batches_per_epoch());
  next_return_ = next_schedule_;
  const auto from = static_cast<size_t>(std::min<int64_t>(next_schedule_ * options_.batch_size,
                                                          static_cast<int64_t>(order_->size())));
  pipeline_->plan(std::vector<int64_t>(order_->begin() + static_cast<std::ptrdiff_t>(from), order_->end()));
  schedule_locked();
}

void Loader::schedule_locked() {
  const int64_t end = batches_per_epoch();
  while (next_schedule_ < end && next_schedule_ - next_return_ < options_.prefetch) {
    const int64_t index = next_schedule_++;
    const uint64_t gen = generation_;
    const int64_t epoch = epoch_;
    auto order = order_;
    auto copies = copies_;
    ++in_flight_;
    pool_->submit([this, gen, epoch, index, order, copies] {
      Slot slot;
      bool cancelled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled = gen != generation_;
      }
      if (!cancelled) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
          slot.batch = build(epoch, index, *order, *copies);
        } catch (...) {
          slot.error = std::current_exception();
        }
        busy_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                               .count(),
                           std::memory_order_relaxed);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (gen == generation_) ready_[index] = std::move(slot);
        --in_flight_;
      }
      cv_.notify_all();
    });
  }
}

std::optional<Batch> Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (epoch_ < 0) throw std::logic_error("Loader::next before start_epoch");
  if (next_return_ >= batches_per_epoch()) {
    pause_clock();
    return std::nullopt;
  }
  cv_.wait(lock, [this] { return ready_.count(next_return_) > 0; });
  auto it = ready_.find(next_return_);
  Slot slot = std::move(it->second);
  ready_.erase(it);
  ++next_return_;
  schedule_locked();
  lock.unlock();
  if (slot.error) std::rethrow_exception(slot.error);
  for (const auto& s : slot.batch->skipped) {
    ++skipped_count_;
    if (skipped_names_.size() < 1000) skipped_names_.push_back(s);
  }
  return std::move(slot.batch);
}

namespace {

// D5: a sample that cannot be read fails the batch naming it (the policy "fail", or an error
// that is not bad input), or is left out under "skip": what the batch's `skipped` then records.
std::string bad_sample(const Error& e, BadSamplePolicy policy, int64_t id, int64_t epoch, int64_t index) {
  if (policy == BadSamplePolicy::kFail || e.kind() != ErrorKind::kBadInput) {
    throw Error(e.kind(), fmt::format("bad sample {} (epoch {}, batch {}): {}; set data.bad_samples = \"skip\" "
                                      "to leave such samples out",
                                      id, epoch, index, e.what()));
  }
  return e.what();
}

}  // namespace

Batch Loader::build(int64_t epoch, int64_t index, const std::vector<int64_t>& order,
                    const std::vector<int64_t>& copies) const {
  if (pipeline_->detection()) return build_detection(epoch, index, order, copies);
  const int64_t begin = index * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(order.size()));
  const ImageSpec spec = pipeline_->output_spec();
  const size_t sample_bytes = static_cast<size_t>(spec.bytes());
  Batch b;
  b.epoch = epoch;
  b.index = index;
  b.spec = spec;
  // Float features come [channels, height, width] already: they go to their slot as they are.
  const bool transpose = options_.channels_first && spec.type == SampleType::kPixels;
  b.channels_first = options_.channels_first || spec.type == SampleType::kFeatures;
  b.pixels = options_.allocate(static_cast<size_t>(end - begin) * sample_bytes);
  b.sample_ids.reserve(static_cast<size_t>(end - begin));
  b.labels.reserve(static_cast<size_t>(end - begin));
  b.target_width = pipeline_->target_width();
  b.targets.reserve(static_cast<size_t>((end - begin) * b.target_width));
  for (int64_t k = begin; k < end; ++k) {
    const int64_t id = order[static_cast<size_t>(k)];
    const int64_t copy = copies.empty() ? 0 : copies[static_cast<size_t>(k)];
    const int64_t key = draw_epoch(epoch, copy);  // a copy draws its own augmentation
    uint8_t* dst = b.pixels.data() + b.labels.size() * sample_bytes;  // compacted past skipped samples
    try {
      if (options_.sample_delay.count() > 0) std::this_thread::sleep_for(options_.sample_delay);  // test seam
      b.labels.push_back(transpose ? pipeline_->produce_channels_first(id, key, dst)
                                   : pipeline_->produce(id, key, dst));
      b.sample_ids.push_back(id);
      if (!copies.empty()) b.copies.push_back(copy);
      if (b.target_width > 0) {
        b.targets.resize(b.labels.size() * static_cast<size_t>(b.target_width));
        pipeline_->copy_targets(id, b.targets.data() + b.targets.size() - static_cast<size_t>(b.target_width));
      }
    } catch (const Error& e) {
      b.skipped.push_back(bad_sample(e, options_.bad_samples, id, epoch, index));
    }
  }
  b.pixels.resize(b.labels.size() * sample_bytes);
  return b;
}

// A detection batch: each sample with its boxes, at its own size, then padded into one buffer.
Batch Loader::build_detection(int64_t epoch, int64_t index, const std::vector<int64_t>& order,
                              const std::vector<int64_t>& copies) const {
  const int64_t begin = index * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(order.size()));
  Batch b;
  b.epoch = epoch;
  b.index = index;
  b.spec = pipeline_->output_spec();
  b.detection = true;
  std::vector<DetectionImage> images;
  images.reserve(static_cast<size_t>(end - begin));
  for (int64_t k = begin; k < end; ++k) {
    const int64_t id = order[static_cast<size_t>(k)];
    const int64_t copy = copies.empty() ? 0 : copies[static_cast<size_t>(k)];
    try {
      if (options_.sample_delay.count() > 0) std::this_thread::sleep_for(options_.sample_delay);  // test seam
      int64_t image_id = -1;
      images.push_back(pipeline_->produce_detection(id, draw_epoch(epoch, copy), &image_id));
      b.labels.push_back(-1);
      b.image_ids.push_back(image_id);
      b.sample_ids.push_back(id);
      if (!copies.empty()) b.copies.push_back(copy);
    } catch (const Error& e) {
      b.skipped.push_back(bad_sample(e, options_.bad_samples, id, epoch, index));
    }
  }
  collate_detection(images, pipeline_->batch_layout(), options_.channels_first, options_.allocate, &b);
  return b;
}

Batch sample_batch(const SamplePipeline& pipeline, int64_t n) {
  Batch b;
  if (pipeline.detection()) {
    std::vector<DetectionImage> images;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = i % pipeline.size();
      int64_t image_id = -1;
      images.push_back(pipeline.produce_detection(id, 0, &image_id));
      b.labels.push_back(-1);
      b.sample_ids.push_back(id);
      b.image_ids.push_back(image_id);
    }
    b.detection = true;
    b.spec = pipeline.output_spec();
    collate_detection(images, pipeline.batch_layout(), false, PixelBuffer::heap, &b);
    return b;
  }
  b.spec = pipeline.output_spec();
  b.channels_first = b.spec.type == SampleType::kFeatures;  // features are [channels, height, width]
  const int64_t bytes = b.spec.bytes();
  b.pixels = PixelBuffer::heap(static_cast<size_t>(n * bytes));
  b.target_width = pipeline.target_width();
  b.targets.resize(static_cast<size_t>(n * b.target_width));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = i % pipeline.size();
    b.labels.push_back(pipeline.produce(id, 0, b.pixels.data() + i * bytes));
    b.sample_ids.push_back(id);
    if (b.target_width > 0) pipeline.copy_targets(id, b.targets.data() + i * b.target_width);
  }
  return b;
}

std::string LoaderThreadChoice::describe() const {
  if (samples_per_s.empty()) return fmt::format("{} thread(s) (not measured)", threads);
  std::string s;
  for (size_t t = 1; t <= samples_per_s.size(); ++t) {
    s += fmt::format("{}{}: {:.0f}/s", t > 1 ? ", " : "", t, samples_per_s[t - 1]);
  }
  return fmt::format("{} thread(s) (measured samples/s with {})", threads, s);
}

LoaderThreadChoice LoaderThreadChoice::from_rates(std::vector<double> samples_per_s) {
  if (samples_per_s.empty()) throw std::logic_error("LoaderThreadChoice::from_rates: no rates");
  LoaderThreadChoice choice;
  choice.samples_per_s = std::move(samples_per_s);
  const double best = *std::max_element(choice.samples_per_s.begin(), choice.samples_per_s.end());
  choice.threads = static_cast<int>(choice.samples_per_s.size());
  for (size_t t = 1; t <= choice.samples_per_s.size(); ++t) {
    if (choice.samples_per_s[t - 1] >= 0.9 * best) {
      choice.threads = static_cast<int>(t);
      break;
    }
  }
  return choice;
}

namespace {

// Samples/s of `threads` workers running `pipeline` for `window`, timed from when every
// worker has started (a worker the scheduler starts late must not count as a slow one).
double measure_rate(const SamplePipeline& pipeline, int threads, std::chrono::milliseconds window) {
  const size_t bytes = static_cast<size_t>(pipeline.output_spec().bytes());
  // A sharded source's first shard only: decoding costs the same in every shard, and a remote
  // source then fetches one shard for the measurement, not every shard over and over.
  const std::vector<int64_t> shards = pipeline.shard_counts();
  const int64_t span = !shards.empty() && shards[0] > 0 ? shards[0] : pipeline.size();
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<int> started{0};
  std::atomic<bool> go{false};
  std::chrono::steady_clock::time_point stop;  // written before `go`, read after it
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      std::vector<uint8_t> dst(bytes);
      ++started;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (std::chrono::steady_clock::now() < stop) {
        const int64_t i = next.fetch_add(1) % span;
        try {
          if (pipeline.detection()) {
            pipeline.produce_detection(i, 0, nullptr);  // its image, at its own size
          } else {
            pipeline.produce(i, 0, dst.data());
          }
        } catch (const Error&) {
        }
        ++done;
      }
    });
  }
  while (started.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  stop = start + window;
  go.store(true, std::memory_order_release);
  for (auto& w : workers) w.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(done.load()) / secs;
}

}  // namespace

LoaderThreadChoice measure_loader_threads(const SamplePipeline& pipeline, int max_threads) {
  LoaderThreadChoice choice;
  max_threads = std::max(1, max_threads);
  if (max_threads == 1 || pipeline.size() == 0) return choice;
  // 300 ms per count, as three interleaved rounds of 100 ms keeping each count's best: other
  // load on the machine only ever slows a round down, and a burst of it lands on one round of
  // every count rather than on all of one count.
  constexpr int kRounds = 3;
  choice.samples_per_s.assign(static_cast<size_t>(max_threads), 0.0);
  for (int round = 0; round < kRounds; ++round) {
    for (int t = 1; t <= max_threads; ++t) {
      double& best = choice.samples_per_s[static_cast<size_t>(t - 1)];
      best = std::max(best, measure_rate(pipeline, t, std::chrono::milliseconds(100)));
    }
  }
  return LoaderThreadChoice::from_rates(std::move(choice.samples_per_s));
}

int choose_loader_threads(const SamplePipeline& pipeline, int max_threads, std::string* report) {
  const LoaderThreadChoice choice = measure_loader_threads(pipeline, max_threads);
  if (report != nullptr && !choice.samples_per_s.empty()) *report = choice.describe();
  return choice.threads;
}

}  // namespace crucible::data
