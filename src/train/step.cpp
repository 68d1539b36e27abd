// accumulate_gradients: micro-batches weighted by their share of the batch (see step.h).
#include "crucible/train/step.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "crucible/core/compat.h"
#include "crucible/nn/model.h"

namespace crucible::train {

MicroBatchRecord accumulate_gradients(nn::Model& model, const at::Tensor& x, const at::Tensor& y,
                                      const MicroBatchOptions& options, at::Tensor& loss_sum, at::Tensor& correct) {
  MicroBatchRecord record;
  for (const auto& p : model.module().parameters()) {
    if (p.dim() == 4 && p.size(1) > 1) {  // a convolution weight whose two layouts differ
      record.channels_last = p.is_contiguous(at::MemoryFormat::ChannelsLast) && !p.is_contiguous();
      break;
    }
  }
  const int64_t n = x.size(0);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(options.parts, n));
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (end <= begin) continue;
    if (options.before_forward) options.before_forward(end - begin);
    const at::Tensor xs = x.narrow(0, begin, end - begin);
    const at::Tensor ys = y.narrow(0, begin, end - begin);
    at::Tensor logits, loss;
    {
      compat::AutocastGuard amp(x.device().type(), options.amp_dtype, options.autocast);
      logits = model.forward(xs);
      loss = at::cross_entropy_loss(logits, ys, {}, at::Reduction::Mean, -100, options.label_smoothing);
    }
    record.logits_dtype = logits.scalar_type();
    const double weight = static_cast<double>(end - begin) / static_cast<double>(n);
    if (options.before_backward) options.before_backward(p == parts - 1);
    (loss * (weight * options.loss_scale)).backward();
    at::NoGradGuard no_grad;
    loss_sum.add_(loss.detach().to(at::kDouble), static_cast<double>(end - begin));
    correct.add_(logits.detach().argmax(1).eq(ys).sum());
  }
  return record;
}

}  // namespace crucible::train
