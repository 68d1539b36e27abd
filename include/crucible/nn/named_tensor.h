// A tensor with its state_dict name: what models list as parameters and buffers and what
// optimizers and checkpoints keep by name (tier 2: speaks tensors only).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace crucible::nn {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

}  // namespace crucible::nn
