// Data-parallel gradient synchronisation, DDP's reducer rebuilt on c10d collectives:
// parameters are grouped into buckets of about `bucket_mb` in reverse registration order (the
// order backward produces gradients); a hook on each parameter's gradient accumulator counts it
// ready, and a full bucket is flattened and all-reduced asynchronously while backward goes on.
// Buckets launch strictly in order, so every rank issues the same collectives in the same
// order. finish() waits for all of them and leaves every gradient averaged over ranks.
// M5: with communicate(false) the hooks do nothing — accumulation micro-batches stay local,
// and only the last one communicates.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "crucible/nn/named_tensor.h"

namespace torch::nn {
class Module;
}

namespace crucible::nn {
class Model;
}

namespace crucible::distributed {

class Comm;

class GradSync {
 public:
  GradSync(Comm& comm, std::vector<at::Tensor> params, double bucket_mb);
  ~GradSync();  // removes the hooks
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Whether the next backward communicates (true by default).
  void communicate(bool on);
  // After a communicating backward: launches any bucket still waiting (parameters without a
  // gradient count as zero), waits for all, divides by the world size and writes the averages
  // back into every parameter's .grad.
  void finish();

  // Test seam: finish() waits this much longer for the all-reduces (a slow interconnect).
  void set_test_delay(std::chrono::microseconds delay);

  int64_t num_buckets() const;
  std::string describe() const;  // "3 buckets (2.1 MiB, 0.4 MiB, …) over 14 tensors"

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the hooks
};

// Parameters and buffers of `module` from rank `root` to every rank (start of training, so
// that all ranks begin from the same weights whatever their own initialisation did).
void broadcast_module(Comm& comm, torch::nn::Module& module, int root = 0);
void broadcast_module(Comm& comm, nn::Model& model, int root = 0);

// The replicas must hold the same weights: a cheap fingerprint of `params` per rank (the sum and
// the sum of absolute values, in double) is compared at every checkpoint, so a divergence is
// caught where it starts, not in a worse model. runtime_error naming `step` and the first rank
// that differs from rank 0. A collective: every rank calls it.
void check_replicas_equal(Comm& comm, const std::vector<at::Tensor>& params, int64_t step);

// M2: BatchNorm running statistics made equal across ranks: "broadcast" takes rank 0's,
// "average" the mean over ranks. Other buffers (counters) are broadcast. Call before
// evaluating and before a checkpoint.
void sync_buffers(Comm& comm, torch::nn::Module& module, const std::string& policy);
void sync_buffers(Comm& comm, nn::Model& model, const std::string& policy);
// The same for buffers listed by name (a copy of a model's, e.g. a weight average's).
void sync_buffers(Comm& comm, const std::vector<nn::NamedTensor>& buffers, const std::string& policy);

}  // namespace crucible::distributed
