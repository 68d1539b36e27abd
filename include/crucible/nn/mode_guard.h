// M1: the only way to evaluate. EvalGuard switches a module to eval mode (BatchNorm uses its
// running statistics, Dropout is off) and turns gradient recording off for its lifetime,
// then restores the previous mode. Not thread-safe (grad mode is per thread).
#pragma once

#include <c10/core/GradMode.h>

namespace torch::nn {
class Module;
}

namespace crucible::nn {

class EvalGuard {
 public:
  explicit EvalGuard(torch::nn::Module& module);
  ~EvalGuard();
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
  c10::NoGradGuard no_grad_;
};

}  // namespace crucible::nn
