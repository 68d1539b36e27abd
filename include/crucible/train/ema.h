// Weight EMA (train.ema): an exponential moving average of the model's parameters and buffers,
// equal to torchvision's classification reference (references/classification/train.py
// --model-ema: utils.ExponentialMovingAverage, which is torch.optim.swa_utils.AveragedModel with
// avg_fn = decay·avg + (1 − decay)·model and use_buffers=True). WeightEma is that average over
// named tensors; the step observer that keeps one for a run (ema.cpp: updated after the
// optimizer step every train.ema_steps loader iterations, evaluated after every epoch beside
// the model, kept in every checkpoint) is built from the recipe's registry. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "crucible/nn/named_tensor.h"
#include "crucible/train/ema_options.h"

namespace crucible::train {

struct TrainSection;

// The decay the average uses (AveragedModel's `decay`): train.ema_decay as given, or with
// train.ema_adjust torchvision's adjustment for the update interval and the batch, in double as
// train.py computes it: adjust = world × batch × ema_steps / epochs, alpha = min(1, (1 −
// ema_decay) × adjust), decay = 1 − alpha. `world_size` ranks, train.batch_size per rank.
double ema_decay(const EmaOptions& ema, const TrainSection& train, int world_size);

class WeightEma {
 public:
  // AveragedModel(model, device): a copy of `tensors` (the model's parameters then buffers, as
  // a state_dict lists them) on their device, in their dtype and memory format; nothing
  // averaged yet. `decay` in [0, 1].
  WeightEma(const std::vector<nn::NamedTensor>& tensors, double decay);

  // AveragedModel.update_parameters(model): `model` lists the same names, shapes and dtypes in
  // the same order (runtime_error otherwise). With nothing averaged yet (n_averaged == 0) each
  // tensor is copied; after that each becomes decay·avg + (1 − decay)·model computed as torch
  // does it (two products and a sum in the tensor's dtype; an integer buffer such as BatchNorm's
  // num_batches_tracked promotes to float32 and is truncated back by the copy). n_averaged + 1.
  void update(const std::vector<nn::NamedTensor>& model);

  // n_averaged.fill_(0): the next update copies again (train.py during the lr warm-up).
  void reset_count() { n_averaged_ = 0; }
  int64_t n_averaged() const { return n_averaged_; }
  void set_n_averaged(int64_t n) { n_averaged_ = n; }
  double decay() const { return decay_; }

  // The averaged tensors (the names of the model's), to read, checkpoint or restore in place.
  std::vector<nn::NamedTensor>& tensors() { return avg_; }
  const std::vector<nn::NamedTensor>& tensors() const { return avg_; }

 private:
  std::vector<nn::NamedTensor> avg_;
  double decay_;
  int64_t n_averaged_ = 0;  // on the host: the loop knows when it updates (no device read, law 2)
};

}  // namespace crucible::train
