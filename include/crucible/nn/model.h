// The model zoo. A Model wraps a torch::nn::Module with a forward on tensors and states the
// input it expects (law 3): channels, size and value range. Forward-declares torch::nn so
// this header stays light (tier 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "crucible/nn/model_options.h"

namespace torch::nn {
class Module;
}

namespace crucible::nn {

// What a model accepts: [batch, channels, height, width] float, normalised (x - mean) / std.
// height/width 0 means any size.
struct InputSpec {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
};

// Not thread-safe: one thread trains or evaluates a model.
class Model {
 public:
  virtual ~Model() = default;
  // [batch, channels, height, width] float → [batch, num_classes] logits.
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual torch::nn::Module& module() = 0;
  virtual InputSpec input_spec() const = 0;
  virtual std::string describe() const = 0;
};

// Builds `options.name` with weights from torch's default CPU generator (seed it first).
// Throws bad_input for an unknown name or an input the model cannot take.
std::unique_ptr<Model> make_model(const ModelOptions& options, int64_t in_channels, int64_t height, int64_t width,
                                  int64_t num_classes);

// Stores the 4-D (convolution) weights in channels_last (NHWC) memory format.
void to_channels_last(Model& model);

// Number of trainable parameters.
int64_t parameter_count(Model& model);

}  // namespace crucible::nn
