// BatchNorm2d that can become SyncBatchNorm (M3). crucible's models use it in place of
// torch::nn::BatchNorm2d: same parameters, buffers, names, initialisation and results (it is
// not a subclass: libtorch does not export what a subclass's vtable needs), and
// convert_sync_batchnorm() switches every instance in a module to statistics over the global
// batch of all ranks. The collectives come through the small Collective interface (collective.h),
// which the dist layer implements (nn sits above dist and does not know about process groups).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "crucible/nn/collective.h"

namespace crucible::nn {

class BatchNorm2dImpl : public torch::nn::Module {
 public:
  // torch::nn::BatchNorm2d's defaults: eps 1e-5, momentum 0.1, affine, tracking running stats.
  explicit BatchNorm2dImpl(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  // Training with a collective set: mean and variance over every rank's batch (Welford-combined
  // from each rank's mean, variance and count), gradients through the same global sums, as
  // torch.nn.SyncBatchNorm. Otherwise exactly torch::nn::BatchNorm2d.
  at::Tensor forward(const at::Tensor& input);
  void set_collective(Collective* collective) { collective_ = collective; }
  Collective* collective() const { return collective_; }
  int64_t num_features() const { return num_features_; }
  void pretty_print(std::ostream& stream) const override;

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  int64_t num_features_;
  double eps_, momentum_;
  Collective* collective_ = nullptr;
};
TORCH_MODULE(BatchNorm2d);

// torchvision.ops.FrozenBatchNorm2d: BatchNorm with fixed statistics and affine terms, all four
// buffers (weight, bias, running_mean, running_var; no num_batches_tracked, no parameters), the
// same forward operation for operation. A detector's backbone uses it (M2 for detection: the
// statistics are ImageNet's, not a batch of two images').
class FrozenBatchNorm2dImpl : public torch::nn::Module {
 public:
  explicit FrozenBatchNorm2dImpl(int64_t num_features, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  at::Tensor weight, bias, running_mean, running_var;

 private:
  double eps_;
};
TORCH_MODULE(FrozenBatchNorm2d);

// M3: every crucible BatchNorm2d in `module` computes statistics over all ranks from now on.
// Call before gradient synchronisation is set up. Returns how many were converted; bad_input
// when the module holds a torch BatchNorm that cannot be converted (name it).
int convert_sync_batchnorm(torch::nn::Module& module, Collective* collective);

}  // namespace crucible::nn
