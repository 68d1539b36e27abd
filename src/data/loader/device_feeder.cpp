// DeviceFeeder: each batch's copy and conversion queued on a side stream ahead of the step (D9).
// Written over c10's device-generic streams and events (VirtualGuardImpl, StreamGuard, Event), so
// it compiles against a CPU-only libtorch and uses CUDA where the device is a GPU.
#include "crucible/data/loader/device_feeder.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::data {

struct DeviceFeeder::Streams {
  explicit Streams(c10::Device device)
      : impl(device.type()),
        // A pool stream, not the default one: the default stream would serialise with everything.
        copy(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)) {}
  c10::impl::VirtualGuardImpl impl;
  c10::Stream copy;
};

struct FedBatch::Pending {
  explicit Pending(c10::DeviceType type) : copied(type) {}
  c10::Event copied;  // recorded on the copy stream after the batch's copy and conversion
};

DeviceFeeder::DeviceFeeder(const DeviceInput& input, c10::Device device, Options options)
    : input_(input), device_(device), options_(options) {
  if (options_.ahead < 0) throw bad_input("the device feeder's ahead must be >= 0, found {}", options_.ahead);
  side_ = device_.is_cuda() && options_.ahead > 0;
  if (side_) streams_ = std::make_unique<Streams>(device_);
}

DeviceFeeder::~DeviceFeeder() = default;

std::string DeviceFeeder::describe() const {
  const std::string batches = fmt::format("{} batch{}", options_.ahead, options_.ahead == 1 ? "" : "es");
  if (side_) return "copies on a side stream, " + batches + " ahead";
  if (options_.ahead > 0) return "converted when taken, " + batches + " pulled ahead";
  return "converted when taken";
}

c10::Stream DeviceFeeder::copy_stream() const {
  if (!side_) throw std::logic_error("DeviceFeeder::copy_stream: no side stream (CPU, or ahead = 0)");
  return streams_->copy;
}

void DeviceFeeder::enqueue(FedBatch& b) const {
  if (!side_) return;  // converted in hand_over
  {
    // Everything the conversion launches goes to the copy stream: the copies (non_blocking from
    // pinned memory, so the host does not wait) and the uint8 → float kernels.
    c10::StreamGuard on_copy(streams_->copy);
    if (options_.time_copies) b.copy_begin = compat::record_timeline_mark(device_);
    b.images = input_.images(b.host);
    b.labels = input_.labels(b.host);
    b.boxes = input_.boxes(b.host, &b.box_labels);
    if (options_.time_copies) b.copy_end = compat::record_timeline_mark(device_);
    b.pending_ = std::make_shared<FedBatch::Pending>(device_.type());
    b.pending_->copied.record(streams_->copy);
  }
  // The pinned pixels go back to torch's host allocator now; it holds them from reuse until the
  // copy queued above has run (the event it records for a non_blocking copy from pinned memory).
  b.host.pixels = PixelBuffer();
}

std::optional<FedBatch> DeviceFeeder::take(const Pull& pull) {
  while (!ended_ && static_cast<int64_t>(queue_.size()) <= options_.ahead) {
    std::optional<Batch> next = pull();
    if (!next) {
      ended_ = true;
      break;
    }
    FedBatch b;
    b.host = std::move(*next);
    enqueue(b);
    queue_.push_back(std::move(b));
  }
  if (queue_.empty()) return std::nullopt;
  FedBatch front = std::move(queue_.front());
  queue_.pop_front();
  most_ahead_ = std::max(most_ahead_, static_cast<int64_t>(queue_.size()));
  return front;
}

void DeviceFeeder::hand_over(FedBatch& b) const {
  if (!side_) {
    if (!b.images.defined()) {
      b.images = input_.images(b.host);
      b.labels = input_.labels(b.host);
      b.boxes = input_.boxes(b.host, &b.box_labels);
    }
    return;
  }
  if (!b.pending_) return;  // already handed over
  const c10::Stream compute = streams_->impl.getStream(device_);
  b.pending_->copied.block(compute);  // the device waits for the copy; the host goes on
  // Allocated on the copy stream, read on the compute stream: without this the caching allocator
  // could give the blocks to a later copy as soon as these tensors die, while the step still reads.
  b.images.record_stream(compute);
  b.labels.record_stream(compute);
  if (b.boxes.defined()) {
    b.boxes.record_stream(compute);
    b.box_labels.record_stream(compute);
  }
  b.pending_.reset();
}

void DeviceFeeder::reset() {
  queue_.clear();
  ended_ = false;
}

}  // namespace crucible::data
