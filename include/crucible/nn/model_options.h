// Options of the model zoo, torch-free so that configs and tools can name models without
// compiling torch (the models themselves are in nn/model.h).
#pragma once

#include <string>
#include <vector>

namespace crucible::nn {

struct ModelOptions {
  std::string name = "fmnist_cnn";
  double dropout = 0.25;
  // model.name = "torchscript": the module file (torch.jit.save(torch.jit.script(model))).
  std::string path;
  // Fine-tuning: weights to start from (a torch.save state_dict .pt or a .safetensors file);
  // "" = the model's own initialisation.
  std::string init;
  // Names in the model or the file that may be missing from the other (glob patterns).
  std::vector<std::string> init_ignore;
  // Parameters kept fixed (glob patterns over parameter names): not optimised, not synced.
  std::vector<std::string> freeze;
};

}  // namespace crucible::nn
