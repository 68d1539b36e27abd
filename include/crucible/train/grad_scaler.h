// GradScaler (T1): dynamic loss scaling for fp16, which libtorch's C++ API lacks. The rule is
// PyTorch's (torch/amp/grad_scaler.py, ATen's _amp_update_scale_): multiply the loss by
// `scale`; unscale the gradients before clipping; if any gradient is inf/NaN, skip the
// optimizer step, multiply the scale by `backoff` and reset the growth counter; otherwise
// count the clean step and multiply the scale by `growth` after `interval` clean steps in a
// row. Device-generic (foreach-free ATen ops) because the fused kernels are CUDA-only on 1.13.
// Scale and counter are checkpointed. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace crucible::train {

struct CheckpointData;

struct GradScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth = 2.0;
  double backoff = 0.5;
  int64_t interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool enabled() const { return opt_.enabled; }
  // loss × scale (the loss itself when disabled).
  at::Tensor scale_loss(const at::Tensor& loss) const;
  // Multiplies every defined gradient by 1/scale in place (no-op when disabled).
  void unscale(const std::vector<at::Tensor>& grads) const;
  // The rule above, given whether this step's gradients were all finite. Returns whether the
  // optimizer step is to be taken.
  bool update(bool found_inf);

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  void load(double scale, int64_t tracker);
  // The scale and growth counter as checkpoint metadata ("loss_scale", "loss_scale_tracker"):
  // what the Trainer writes and reads back (T1).
  void save(CheckpointData& checkpoint) const;
  void restore(const CheckpointData& checkpoint, const std::string& path);

 private:
  GradScalerOptions opt_;
  double scale_;
  int64_t tracker_ = 0;
};

// The first of `named` (names parallel to tensors) that holds an inf or NaN, or "" when all
// are finite. Reads one bool per tensor from the device: call only on the bad path.
std::string first_non_finite(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors);

// Whether every defined tensor is finite, as one device bool read on the host.
bool all_finite(const std::vector<at::Tensor>& tensors);

}  // namespace crucible::train
