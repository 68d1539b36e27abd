// The gradient half of a training step (M5): one batch run as `parts` micro-batches, each
// micro-batch's mean loss weighted by its share of the batch, so the summed gradients equal
// those of the whole batch's mean loss — for any split, uneven ones included — whenever the
// model treats samples independently (BatchNorm in training mode does not: it normalises each
// micro-batch by its own statistics, as it would in any framework). Used by the Trainer; the
// rest of the step (unscale, clip, finiteness vote, optimizer) stays there for now.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace crucible::nn {
class Model;
}

namespace crucible::train {

struct MicroBatchOptions {
  int64_t parts = 1;                                  // micro-batches (clamped to the batch size)
  double label_smoothing = 0.0;                       // cross-entropy label smoothing
  bool autocast = false;                              // mixed precision forward
  c10::ScalarType amp_dtype = c10::ScalarType::BFloat16;
  double loss_scale = 1.0;                            // GradScaler's factor (T1), 1 when off
  // Called with each micro-batch's size before its forward (a test seam raises here).
  std::function<void(int64_t samples)> before_forward;
  // Called before each backward; `last` on the final micro-batch (gradient sync arms there).
  std::function<void(bool last)> before_backward;
};

// What the step ran in, for the record (summary.json): the logits' dtype and whether the
// model's convolution weights were channels_last (the weights, not the input: with one input
// channel both layouts have the same strides).
struct MicroBatchRecord {
  c10::ScalarType logits_dtype = c10::ScalarType::Undefined;
  bool channels_last = false;
};

// Forward + backward of `x` [B, C, H, W] / `y` [B] in `options.parts` micro-batches, gradients
// accumulated into the parameters' .grad. Adds Σ loss × samples to `loss_sum` (double, device)
// and the number of correct argmaxes to `correct` (long, device): no host read.
MicroBatchRecord accumulate_gradients(nn::Model& model, const at::Tensor& x, const at::Tensor& y,
                                      const MicroBatchOptions& options, at::Tensor& loss_sum, at::Tensor& correct);

}  // namespace crucible::train
