// M1: the only way to evaluate. EvalGuard switches a module to eval mode (BatchNorm uses its
// running statistics, Dropout is off) and turns gradient recording off for its lifetime,
// then restores the previous mode. Not thread-safe (grad mode is per thread).
#pragma once

#include <c10/core/GradMode.h>

namespace crucible::nn {

class Model;

class EvalGuard {
 public:
  explicit EvalGuard(Model& model);
  ~EvalGuard();
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Model& model_;
  bool was_training_;
  c10::NoGradGuard no_grad_;
};

}  // namespace crucible::nn
