// EvalGuard: eval mode + no-grad for a scope, previous mode restored (M1).
#include "crucible/nn/mode_guard.h"

#include "crucible/nn/model.h"

namespace crucible::nn {

EvalGuard::EvalGuard(Model& model) : model_(model), was_training_(model.is_training()) { model_.train(false); }

EvalGuard::~EvalGuard() { model_.train(was_training_); }

}  // namespace crucible::nn
