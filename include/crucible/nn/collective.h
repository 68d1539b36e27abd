// Collective: what SyncBatchNorm (batch_norm.h) needs from a process group, in a light header
// (ATen's Tensor only) so that distributed/comm.h, which implements it, does not pull torch's nn
// headers into everything that talks to other ranks.
#pragma once

#include <ATen/core/Tensor.h>

namespace crucible::nn {

// What SyncBatchNorm needs from a process group. Blocking; every rank calls in the same order.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the sum over ranks.
  virtual void all_reduce_sum(at::Tensor& t) = 0;
  // Equal shapes on every rank → [size, ...] in rank order.
  virtual at::Tensor all_gather(const at::Tensor& t) = 0;
};

// The collective of a single process (world of 1): SyncBatchNorm's numerics without peers.
class LocalCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(at::Tensor&) override {}
  at::Tensor all_gather(const at::Tensor& t) override { return t.unsqueeze(0); }
};

}  // namespace crucible::nn
