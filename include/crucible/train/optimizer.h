// Optimizers written for crucible (T8): AdamW and SGD with Nesterov momentum, with the exact
// update rules of PyTorch's torch.optim (single-tensor path), parameter groups, gradients set
// to none (T10), state kept in fp32 (T3) and exposed by name for checkpoints. The learning
// rate and momentum of each step come from the Schedule. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <functional>

#include <ATen/core/Tensor.h>

#include "crucible/core/registry.h"

#include "crucible/nn/named_tensor.h"
#include "crucible/train/optim_options.h"

namespace crucible::train {

using NamedTensor = nn::NamedTensor;

// A set of parameters sharing options.
struct ParamGroup {
  std::vector<NamedTensor> params;
  double weight_decay = 0.0;
  std::string name;  // in metrics (T4's update norms); parameter_groups: "weights", "bias_and_norm"
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update with this step's lr and momentum (beta1 for AdamW). Parameters whose grad is
  // undefined are skipped.
  virtual void step(double lr, double momentum) = 0;

  // Sets every gradient to none (T10): no kernel writes zeros, memory is freed.
  void zero_grad();

  // State tensors by stable name ("<param>.exp_avg", …) plus scalars, for checkpoints.
  virtual std::vector<NamedTensor> state() const = 0;
  // Restores state written by state(); throws bad_input naming a missing or mismatched tensor.
  virtual void load_state(const std::vector<NamedTensor>& state) = 0;
  virtual std::string describe() const = 0;

  const std::vector<ParamGroup>& groups() const { return groups_; }

 protected:
  std::vector<ParamGroup> groups_;
};

// An optimizer in the registry: how to build it, and which of its options the schedule's
// momentum stands for (beta1 for AdamW, momentum for SGD) when no schedule cycles it.
struct OptimizerKind {
  std::function<std::unique_ptr<Optimizer>(const OptimOptions&, std::vector<ParamGroup>)> make;
  std::function<double(const OptimOptions&)> momentum;
};

// Every optimizer by name (optim.name's allowed values). Adding one is one line here.
const Registry<OptimizerKind>& optimizer_registry();

// Builds options.name over `groups`. Throws bad_input for an unknown name.
std::unique_ptr<Optimizer> make_optimizer(const OptimOptions& options, std::vector<ParamGroup> groups);

// The momentum options.name's step takes when nothing schedules it (beta1 / momentum).
double optimizer_momentum(const OptimOptions& options);

}  // namespace crucible::train
