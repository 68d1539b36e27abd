// Loader: ordered, bounded, cancellable batch building on a persistent ThreadPool.
#include "crucible/data/loader.h"

#include <algorithm>
#include <cstring>

#include "crucible/core/error.h"
#include "crucible/core/rng.h"
#include "crucible/core/thread_pool.h"

namespace crucible::data {

Loader::Loader(std::shared_ptr<const Source> source, Sampler sampler, LoaderOptions options)
    : source_(std::move(source)), sampler_(sampler), options_(options) {
  if (options_.batch_size < 1) throw bad_input("loader: batch_size must be >= 1, found {}", options_.batch_size);
  if (options_.threads < 1) throw bad_input("loader: threads must be >= 1, found {}", options_.threads);
  if (options_.prefetch < 1) throw bad_input("loader: prefetch must be >= 1, found {}", options_.prefetch);
  if (sampler_.size() != source_->size()) {
    throw std::logic_error("Loader: sampler size differs from source size");
  }
  pool_ = std::make_unique<ThreadPool>(options_.threads);
}

Loader::~Loader() {
  cancel_and_wait();
  pool_.reset();
}

int64_t Loader::batches_per_epoch() const {
  const int64_t n = source_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void Loader::cancel_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  ++generation_;
  cv_.wait(lock, [this] { return in_flight_ == 0; });
  ready_.clear();
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  auto order = std::make_shared<const std::vector<int64_t>>(sampler_.epoch_order(epoch));
  cancel_and_wait();
  std::lock_guard<std::mutex> lock(mu_);
  epoch_ = epoch;
  order_ = std::move(order);
  next_schedule_ = std::clamp<int64_t>(first_batch, 0, batches_per_epoch());
  next_return_ = next_schedule_;
  schedule_locked();
}

void Loader::schedule_locked() {
  const int64_t end = batches_per_epoch();
  while (next_schedule_ < end && next_schedule_ - next_return_ < options_.prefetch) {
    const int64_t index = next_schedule_++;
    const uint64_t gen = generation_;
    const int64_t epoch = epoch_;
    auto order = order_;
    ++in_flight_;
    pool_->submit([this, gen, epoch, index, order] {
      Slot slot;
      bool cancelled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled = gen != generation_;
      }
      if (!cancelled) {
        try {
          slot.batch = build(epoch, index, *order);
        } catch (...) {
          slot.error = std::current_exception();
        }
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
  if (next_return_ >= batches_per_epoch()) return std::nullopt;
  cv_.wait(lock, [this] { return ready_.count(next_return_) > 0; });
  auto it = ready_.find(next_return_);
  Slot slot = std::move(it->second);
  ready_.erase(it);
  ++next_return_;
  schedule_locked();
  lock.unlock();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

Batch Loader::build(int64_t epoch, int64_t index, const std::vector<int64_t>& order) const {
  const int64_t begin = index * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(order.size()));
  const ImageSpec spec = source_->spec();
  const int64_t sample_bytes = spec.bytes();
  const int64_t row_bytes = spec.width * spec.channels;
  Batch b;
  b.epoch = epoch;
  b.index = index;
  b.spec = spec;
  b.sample_ids.assign(order.begin() + begin, order.begin() + end);
  b.pixels.resize(static_cast<size_t>((end - begin) * sample_bytes));
  b.labels.resize(static_cast<size_t>(end - begin));
  for (int64_t k = 0; k < end - begin; ++k) {
    const int64_t id = b.sample_ids[k];
    const uint8_t* src = source_->pixels(id);
    uint8_t* dst = b.pixels.data() + k * sample_bytes;
    b.labels[k] = source_->label(id);
    SampleRng rng(options_.augment_seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(id));
    const bool flip = options_.hflip > 0.0f && rng.bernoulli(options_.hflip);
    if (!flip) {
      std::memcpy(dst, src, static_cast<size_t>(sample_bytes));
      continue;
    }
    for (int64_t y = 0; y < spec.height; ++y) {
      const uint8_t* s = src + y * row_bytes;
      uint8_t* d = dst + y * row_bytes;
      for (int64_t x = 0; x < spec.width; ++x) {
        std::memcpy(d + x * spec.channels, s + (spec.width - 1 - x) * spec.channels, static_cast<size_t>(spec.channels));
      }
    }
  }
  return b;
}

}  // namespace crucible::data
