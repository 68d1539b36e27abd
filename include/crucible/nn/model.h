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
#include "crucible/data/loader/device_input.h"

#include "crucible/nn/model_options.h"
#include "crucible/nn/named_tensor.h"

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

// A model is its forward, its named tensors, its mode and its device: what training, evaluation,
// checkpoints and fine-tuning need, whether it is a torch::nn module (the zoo) or a TorchScript
// module (model.name = "torchscript"). Not thread-safe: one thread trains or evaluates a model.
class Model {
 public:
  virtual ~Model() = default;
  // [batch, channels, height, width] float → [batch, num_classes] logits.
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // Every parameter (trainable or frozen), then every buffer, by state_dict name and in
  // state_dict order; the tensors are the model's own (writing into them changes the model).
  virtual std::vector<NamedTensor> named_parameters() = 0;
  virtual std::vector<NamedTensor> named_buffers() = 0;
  // Train mode (BatchNorm on batch statistics, Dropout on) or eval mode, for every submodule.
  virtual void train(bool on) = 0;
  virtual bool is_training() const = 0;
  virtual void to(c10::Device device) = 0;
  // The torch::nn module behind the model, for the torch::nn-only features (SyncBatchNorm
  // conversion, the bias-before-BatchNorm lint); nullptr where there is none (TorchScript).
  virtual torch::nn::Module* nn_module() { return nullptr; }
  // Writes the model with its current weights in the format it came in, for Python to load:
  // TorchScript (torch.jit.load) as <run_dir>/<stem>.ts.pt, an exported program
  // (torch.export) as <run_dir>/<stem>.pt2, atomically; returns the path, or "" where there is
  // no such format (the zoo's torch::nn models: safetensors only).
  virtual std::string save_program(const std::string& /*run_dir*/, const std::string& /*stem*/) { return ""; }
  virtual InputSpec input_spec() const = 0;
  virtual std::string describe() const = 0;
  // Where the model holds a classification network's trunk by that network's names (a
  // detector's "backbone.body." holds torchvision's ResNet without fc), so that model.init can
  // start it from that network's weights; "" where there is none.
  virtual std::string trunk_prefix() const { return ""; }
};

// A Model around a torch::nn::Module: tensors, mode and device are the module's. The zoo's
// models derive from it and add forward, input_spec and describe.
class ModuleModel : public Model {
 public:
  explicit ModuleModel(std::shared_ptr<torch::nn::Module> module);
  std::vector<NamedTensor> named_parameters() override;
  std::vector<NamedTensor> named_buffers() override;
  void train(bool on) override;
  bool is_training() const override;
  void to(c10::Device device) override;
  torch::nn::Module* nn_module() override { return module_.get(); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
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

// Number of parameter elements (trainable or frozen).
int64_t parameter_count(Model& model);

// The model's torch::nn module, for a feature that only torch::nn models have (`feature`, e.g.
// "dist.bn = sync"): throws bad_input naming the feature when the model has none (TorchScript).
torch::nn::Module& require_nn_module(Model& model, const std::string& feature);

}  // namespace crucible::nn
