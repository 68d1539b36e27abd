// EvalGuard: eval mode + no-grad for a scope, previous mode restored (M1).
#include "crucible/nn/mode_guard.h"

#include <torch/nn/module.h>

namespace crucible::nn {

EvalGuard::EvalGuard(torch::nn::Module& module) : module_(module), was_training_(module.is_training()) {
  module_.eval();
}

EvalGuard::~EvalGuard() { module_.train(was_training_); }

}  // namespace crucible::nn
