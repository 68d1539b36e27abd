// T6: every read of a device value on the host in the training path goes through host_values(),
// which counts it by reason, so summary.json can state the host reads per step and a test can
// fail when the step gains one. A host read waits for the device to finish everything queued
// before it; on a GPU each one idles the device's queue (law 2: the loss is read once per log
// interval). The reads the step keeps, and why (DESIGN.md, law 2):
//   step vote       one per step: are the loss and gradients finite (and, under data parallel,
//                   does any rank want to stop)? The step must know before the optimizer runs,
//                   as torch's GradScaler.step() does with found_inf.
//   interval        one per log.every_steps: the interval's loss, accuracy and norms (law 2).
//   sync_bn_count   one per SyncBatchNorm layer and forward: the global count of values per
//                   channel, to refuse 1 (torch's SyncBatchNorm reads it too).
//   diagnosis       only when a step is bad: which tensor is not finite.
//   histogram       log.histogram_every only.
//   replicas        at checkpoints under data parallel: the replicas' weight fingerprints.
// Thread-safe (SyncBatchNorm's backward runs on autograd's threads).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace crucible {

enum class HostRead { kStepVote, kInterval, kSyncBnCount, kDiagnosis, kHistogram, kReplicas };
constexpr int kHostReadReasons = 6;
const char* host_read_name(HostRead why);

// `t`'s values as doubles on the host (any dtype; flattened in row-major order), counted. The
// training path reads no other way: tests/scripts/host_reads_test.py fails on an .item(), a copy
// to the CPU or an at::equal() in its sources that does not say why it is outside the step.
std::vector<double> host_values(const at::Tensor& t, HostRead why);

// Values of several device tensors packed by name into one tensor of doubles, so that a
// collective reduces them in one call and the host reads them in one counted read; then read
// back by name, so no reader counts positions. Not thread-safe.
class PackedValues {
 public:
  // Appends `values` (any dtype and shape, flattened in row-major order) under `name`.
  void add(const std::string& name, const at::Tensor& values);
  // Every entry in the order added, one double tensor on their device (made on the first call).
  at::Tensor& packed();
  // One host read of packed(), counted as `why`.
  void read(HostRead why);
  // After read(): an entry's values, or its one value (bad name or size: std::logic_error).
  std::vector<double> values(const std::string& name) const;
  double value(const std::string& name) const;

 private:
  struct Entry {
    std::string name;
    size_t offset = 0, size = 0;
  };
  const Entry& entry(const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<at::Tensor> parts_;
  at::Tensor packed_;
  std::vector<double> host_;
};

// Reads counted since the process started, by reason (index: the enum's value).
std::array<int64_t, kHostReadReasons> host_read_counts();

}  // namespace crucible
