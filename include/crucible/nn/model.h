// The model zoo. A Model wraps a torch::nn::Module with a forward on tensors and states the
// input it expects (law 3): channels, size and value range. Forward-declares torch::nn so
// this header stays light (tier 2).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include <ATen/core/Tensor.h>

#include "crucible/core/registry.h"
#include "crucible/data/device_input.h"

#include "crucible/nn/model_options.h"

namespace torch::nn {
class Module;
}

namespace crucible::nn {

// What a model accepts (law 3): [batch, channels, height, width] float, in a channel order,
// normalised (x - mean) / std. A model built from scratch states its channels and takes
// whatever convention the pipeline delivers on its first step; from then on (in its
// checkpoints, for resume and eval, and for pretrained weights) the convention is part of the
// model and is checked against the pipeline at start-up.
struct InputSpec {
  int64_t channels = 0;
  int64_t height = 0;  // the size it was built for (fmnist_cnn pools other sizes to that grid)
  int64_t width = 0;
  std::optional<data::ColorOrder> order;  // unset: any (not trained yet)
  std::vector<double> mean, std;          // per channel, 0–1 units, in `order`; empty: any

  // The spec with `delivered`'s order and normalisation (what training makes of it).
  InputSpec trained_on(const data::InputConvention& delivered) const;
  std::string to_json() const;
  static InputSpec from_json(const std::string& text, const std::string& source);
  std::string describe() const;
};

// Law 3: throws bad_input when what the pipeline delivers is not what the model takes —
// channel count, channel order or normalisation (to 1e-6) — naming `model` (e.g. "the model
// in ckpt-….safetensors"), both conventions and the config keys to change.
void check_input(const InputSpec& expected, const data::InputConvention& delivered, const std::string& model);

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

// What a model is built for: its options and the data's channels, size and class count.
struct ModelBuild {
  const ModelOptions& options;
  int64_t in_channels, height, width, num_classes;
};
using ModelFactory = std::function<std::unique_ptr<Model>(const ModelBuild&)>;

// Every model by name (model.name's allowed values). Adding a model is its own file plus one
// line here (model.cpp).
const Registry<ModelFactory>& model_registry();

// Builds `options.name` with weights from torch's default CPU generator (seed it first).
// Throws bad_input for an unknown name or an input the model cannot take.
std::unique_ptr<Model> make_model(const ModelOptions& options, int64_t in_channels, int64_t height, int64_t width,
                                  int64_t num_classes);

// Stores the 4-D (convolution) weights in channels_last (NHWC) memory format.
void to_channels_last(Model& model);

// Number of trainable parameters.
int64_t parameter_count(Model& model);

}  // namespace crucible::nn
