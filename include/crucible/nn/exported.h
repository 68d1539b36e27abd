// User models exported by torch.export (model.name = "exported", model.path = "net.pt2"):
// crucible reads the PT2 archive's programs (the training IR of torch.export.export: ATen ops,
// functional and in-place) and runs each graph node by node through libtorch's dispatcher with
// autograd on, so the parameters are leaf tensors the optimizer trains and the buffers change
// as the graph says. An archive of crucible.export holds a "train" program and an eval-mode
// program over the same weights, named "model" so that torch.export.load gives it ("eval" is
// read too); a single program's mode is fixed when it was exported.
#pragma once

#include <memory>
#include <string>

#include "crucible/nn/model.h"

namespace crucible::nn {

// The schema versions of torch._export.serde.schema this reader runs (major; any minor).
constexpr int kExportSchemaMajor = 8;

// Loads `b.options.path` for training on inputs [N, in_channels, height, width] with
// num_classes outputs. Throws bad_input, before any work, naming the file and what is wrong:
// not a PT2 archive; a schema version other than kExportSchemaMajor (naming both); a node it
// cannot run (a higher-order op such as cond, an op this libtorch lacks), naming the node and
// its target; not one tensor input and one tensor output; a fixed batch size or an input shape
// other than the data's; a single program exported in train mode (it runs dropout or batch
// norm with training=True) that evaluation would have to run, unless
// model.eval_with_train_program is set. A program exported in eval mode refuses to train at its
// first training forward (bad_input).
std::unique_ptr<Model> make_exported(const ModelBuild& b);

}  // namespace crucible::nn
