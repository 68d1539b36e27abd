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

// Reads counted since the process started, by reason (index: the enum's value).
std::array<int64_t, kHostReadReasons> host_read_counts();

}  // namespace crucible
