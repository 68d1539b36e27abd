// Losses behind a registry (core/registry.h): `loss.name` picks one, its options come from the
// [loss] section. A loss gives the batch's mean (what backward runs on), one value per sample
// (evaluation, gathered over ranks) and the probabilities it models (predict). Targets are
// [B] int64 class indices, or [B, classes] float 0–1 for multi-label data. Adding a loss is one
// class plus one line in loss_registry(). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "crucible/core/registry.h"
#include "crucible/train/job_config.h"

namespace crucible::train {

class Loss {
 public:
  virtual ~Loss() = default;
  // Mean over the batch of the training loss (label smoothing and class weights applied).
  virtual at::Tensor mean(const at::Tensor& logits, const at::Tensor& targets) const = 0;
  // [batch] loss per sample as evaluation reports it (no label smoothing), in the logits' dtype.
  virtual at::Tensor per_sample(const at::Tensor& logits, const at::Tensor& targets) const = 0;
  // [batch, classes] the probability of each class as the loss models it: softmax for
  // cross-entropy, an independent sigmoid per class for binary cross-entropy.
  virtual at::Tensor probabilities(const at::Tensor& logits) const = 0;
  virtual std::string describe() const = 0;
};

// What a loss is built for: its options, the class count, the device of the logits, and
// whether the data is multi-label ([B, classes] targets).
struct LossBuild {
  const LossSection& options;
  int64_t classes;
  c10::Device device;
  bool multi_label = false;
};

using LossFactory = std::function<std::unique_ptr<Loss>(const LossBuild&)>;

const Registry<LossFactory>& loss_registry();

// loss_registry()'s entry for build.options.name; bad_input for an unknown name or options the
// loss cannot take (e.g. class_weights of the wrong length).
std::unique_ptr<Loss> make_loss(const LossBuild& build);

// [batch] bool: the top-scoring class is a right one — equal to the class index, or present
// among multi-label targets (precision at 1). Ties: argmax's pick (the lowest class id).
at::Tensor top1_hits(const at::Tensor& logits, const at::Tensor& targets);
// [batch] bool: a right class is among the k top-scoring ones (torch.topk's k indices).
at::Tensor topk_hits(const at::Tensor& logits, const at::Tensor& targets, int64_t k);

}  // namespace crucible::train
