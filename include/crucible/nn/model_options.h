// Options of the model zoo, torch-free so that configs and tools can name models without
// compiling torch (the models themselves are in nn/model.h).
#pragma once

#include <string>

namespace crucible::nn {

struct ModelOptions {
  std::string name = "fmnist_cnn";
  double dropout = 0.25;
};

}  // namespace crucible::nn
