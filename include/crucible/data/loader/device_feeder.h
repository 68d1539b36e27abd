// D9: batches onto the device ahead of the step, on a stream of their own.
//
// On a GPU each batch's copy (pinned host → device, both the pixels and the targets) and its
// conversion (DeviceInput: uint8 → normalised float) are queued on a copy stream `ahead` batches
// before the step takes the batch, with an event after them. Handing a batch over makes the
// compute stream wait for that event — the device waits, the host never does — so the copies of
// the next batches run while the step computes. Memory is guarded twice: a batch's pinned host
// buffer goes back to torch's caching host allocator once its copy is queued, and that allocator
// keeps the block from reuse until the copy's event has passed (it records one for a
// non_blocking copy from pinned memory); the device tensors are recorded as used by the compute
// stream when handed over, so their blocks are not reused by a later copy until the step that
// read them has run. On the CPU (or with ahead = 0) it is the plain path: the batch is converted
// when it is handed over, in the trainer's transfer phase.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "crucible/core/compat.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"

namespace crucible::data {

// A batch taken from the feeder: its host record (ids, epoch, copies, size; on a GPU its pixels
// already gone to the device) and, once handed over, its device tensors.
struct FedBatch {
  Batch host;
  at::Tensor images, labels;
  at::Tensor boxes, box_labels;  // a detection batch's (DeviceInput::boxes); undefined otherwise
  // With DeviceFeeder::Options::time_copies on a GPU: device-timeline marks on the copy stream
  // before and after this batch's copy and conversion (the D9 overlap test reads them).
  std::shared_ptr<compat::TimelineMark> copy_begin, copy_end;

 private:
  friend class DeviceFeeder;
  struct Pending;
  std::shared_ptr<Pending> pending_;  // the copy stream's event, until handed over
};

class DeviceFeeder {
 public:
  struct Options {
    int64_t ahead = 0;         // batches queued beyond the one being handed over (GPU: data.prefetch)
    bool time_copies = false;  // record copy_begin/copy_end (tests, diagnostics)
  };
  using Pull = std::function<std::optional<Batch>()>;

  // `input` must outlive the feeder. ahead < 0 is refused (bad_input).
  DeviceFeeder(const DeviceInput& input, c10::Device device, Options options);
  ~DeviceFeeder();
  DeviceFeeder(const DeviceFeeder&) = delete;
  DeviceFeeder& operator=(const DeviceFeeder&) = delete;

  // The next batch in the loader's order, nullopt once `pull` has ended and every batch it gave
  // was handed out. Pulls until `ahead` batches wait behind the one returned (fewer at the end of
  // an epoch), queuing each one's copy as it arrives.
  std::optional<FedBatch> take(const Pull& pull);
  // Makes `b`'s device tensors usable by the step on the current (compute) stream: on a GPU the
  // stream waits for the copy's event and the tensors are recorded as in its use; on the CPU the
  // batch is converted now. Idempotent.
  void hand_over(FedBatch& b) const;
  // Drops the queued batches and forgets that `pull` ended (a new epoch, or a restart inside one).
  void reset();

  size_t queued() const { return queue_.size(); }
  int64_t ahead() const { return options_.ahead; }
  // The most batches that were ever queued behind one take() returned, over the feeder's life
  // (reset() keeps it): what the feeder really ran ahead, at most ahead().
  int64_t most_ahead() const { return most_ahead_; }
  bool on_side_stream() const { return side_; }
  // The copy stream (on_side_stream() only; logic_error otherwise): tests queue work on it.
  c10::Stream copy_stream() const;
  std::string describe() const;  // "copies on a side stream, 4 batches ahead" / "converted when taken"

 private:
  void enqueue(FedBatch& b) const;

  const DeviceInput& input_;
  c10::Device device_;
  Options options_;
  bool side_ = false;  // a GPU: copies on copy_stream_
  struct Streams;
  std::unique_ptr<Streams> streams_;
  std::deque<FedBatch> queue_;
  bool ended_ = false;
  int64_t most_ahead_ = 0;
};

}  // namespace crucible::data
