// Fine-tuning (model.init, model.init_ignore, model.freeze): start a model from saved weights
// — a torch.save state_dict (.pt, through the restricted unpickler) or a .safetensors file —
// matched by name, and keep chosen parameters fixed. Loud where torch's load_state_dict(strict=
// False) is silent: every missing or unexpected name stops the run (exit 2) unless listed in
// model.init_ignore; a classifier head whose class count differs from the data's is
// re-initialised and said so. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/nn/model_options.h"
#include "crucible/train/optimizer.h"  // NamedTensor

namespace crucible::nn {
class Model;
}

namespace crucible::train {

struct InitReport {
  int64_t loaded = 0;                      // tensors copied from the file
  std::vector<std::string> reinitialised;  // head tensors kept at their fresh initialisation
  std::vector<std::string> ignored;        // names missing on one side, allowed by init_ignore
  std::vector<std::string> notes;          // what reading adjusted (X4: a stripped "module.")
  int64_t kept = 0;  // a trunk's weights (Model::trunk_prefix): tensors outside it that keep their init
};

// Loads options.init into `module` (parameters and buffers) by name. Names: a "module."
// prefix (DDP, X4) and a single wrapping "state_dict." or "model." level are stripped. A
// tensor of another shape is an error, except the classifier head: a tensor whose first
// dimension is `num_classes` in the model and differs in the file, all else equal (Linear
// weight and bias), or a detector's cls_logits (anchors × classes), keeps its fresh
// initialisation. A model with a trunk (Model::trunk_prefix: a detector) takes a
// classification network's weights (torchvision's ImageNet ResNet) into it, as torchvision's
// weights_backbone: fc and num_batches_tracked left out, the rest of the model at its init. Throws bad_input naming the file and the
// names (missing, unexpected, mis-shapen).
InitReport load_initial_weights(nn::Model& module, const nn::ModelOptions& options, int64_t num_classes);

// The parameters to optimise, in the model's order: all that require a gradient (a detector
// fixes its frozen trunk stages itself) but those whose names match a model.freeze glob (those get requires_grad = false and are listed in `frozen`). A pattern
// that matches no parameter is bad_input (a typo must not silently train everything).
std::vector<NamedTensor> trainable_parameters(nn::Model& module, const std::vector<std::string>& freeze,
                                              std::vector<std::string>* frozen);

}  // namespace crucible::train
