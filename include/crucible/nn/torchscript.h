// User models from Python (model.name = "torchscript", model.path): a module saved with
// torch.jit.save(torch.jit.script(m)), trained like the zoo's models — parameters optimised,
// buffers kept (BatchNorm statistics), train/eval switched — and written back as TorchScript.
#pragma once

#include <memory>
#include <string>

#include "crucible/nn/model.h"

namespace crucible::nn {

// Loads `b.options.path` for training on inputs [N, in_channels, height, width] with
// num_classes outputs. Throws bad_input naming the file when it is missing or not TorchScript,
// when its forward does not give [N, num_classes] logits, when it has no parameters (frozen by
// torch.jit.freeze), and when a mode-dependent op (dropout, batch norm) has its training flag
// fixed — what torch.jit.trace records — so that train()/eval() could not switch it. Turns the
// graph executor's optimisation off (process-wide): the interpreter then runs the same graph
// from the first call, so a resumed run computes what an uninterrupted one does.
std::unique_ptr<Model> make_torchscript(const ModelBuild& b);

}  // namespace crucible::nn
