// Model zoo: fmnist_cnn, the reference CNN of the default job (same layers and parameter
// names as bench/fmnist_baseline.py, so state_dicts interoperate).
#include "crucible/nn/model.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include <cmath>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/layer_scope.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/resnet.h"
#include "crucible/nn/exported.h"
#include "crucible/nn/torchscript.h"

namespace crucible::nn {
namespace {

namespace tnn = torch::nn;

// conv3x3(no bias)-BN-ReLU ×2, maxpool, ×2 again, then linear-ReLU-dropout-linear.
struct FmnistCnnImpl : tnn::Module {
  FmnistCnnImpl(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes, double dropout)
      : conv1(tnn::Conv2dOptions(in_channels, 32, 3).padding(1).bias(false)),
        bn1(32),
        conv2(tnn::Conv2dOptions(32, 32, 3).padding(1).bias(false)),
        bn2(32),
        conv3(tnn::Conv2dOptions(32, 64, 3).padding(1).bias(false)),
        bn3(64),
        conv4(tnn::Conv2dOptions(64, 64, 3).padding(1).bias(false)),
        bn4(64),
        fc1(64 * (height / 4) * (width / 4), 256),
        pooled_height(height / 4),
        pooled_width(width / 4),
        drop(dropout),
        fc2(256, num_classes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("conv3", conv3);
    register_module("bn3", bn3);
    register_module("conv4", conv4);
    register_module("bn4", bn4);
    register_module("fc1", fc1);
    register_module("drop", drop);
    register_module("fc2", fc2);
  }

  at::Tensor forward(const at::Tensor& input) {
    namespace F = torch::nn::functional;
    const auto relu = F::ReLUFuncOptions().inplace(true);
    // Each layer is marked for train.profile = "full" (nn/layer_scope.h), its pooling with it.
    at::Tensor x = layer("layer:conv1", [&] { return F::relu(bn1(conv1(input)), relu); });
    x = layer("layer:conv2", [&] { return F::max_pool2d(F::relu(bn2(conv2(x)), relu), F::MaxPool2dFuncOptions(2)); });
    x = layer("layer:conv3", [&] { return F::relu(bn3(conv3(x)), relu); });
    x = layer("layer:conv4", [&] {
      at::Tensor y = F::max_pool2d(F::relu(bn4(conv4(x)), relu), F::MaxPool2dFuncOptions(2));
      if (y.size(2) != pooled_height || y.size(3) != pooled_width) {
        // Another input size (multi-scale training, M4): pooled to the classifier's grid.
        y = F::adaptive_avg_pool2d(y, F::AdaptiveAvgPool2dFuncOptions({pooled_height, pooled_width}));
      }
      return y;
    });
    x = layer("layer:fc1", [&] { return F::relu(fc1(x.flatten(1)), relu); });
    return layer("layer:fc2", [&] { return fc2(drop(x)); });
  }

  tnn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  tnn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  tnn::Conv2d conv3;
  nn::BatchNorm2d bn3;
  tnn::Conv2d conv4;
  nn::BatchNorm2d bn4;
  tnn::Linear fc1;
  int64_t pooled_height, pooled_width;  // the grid fc1 was built for
  tnn::Dropout drop;
  tnn::Linear fc2;
};

class FmnistCnn final : public ModuleModel {
 public:
  FmnistCnn(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes, double dropout)
      : FmnistCnn(std::make_shared<FmnistCnnImpl>(in_channels, height, width, num_classes, dropout), in_channels,
                  height, width, num_classes, dropout) {}
  FmnistCnn(std::shared_ptr<FmnistCnnImpl> impl, int64_t in_channels, int64_t height, int64_t width,
            int64_t num_classes, double dropout)
      : ModuleModel(impl),
        impl_(std::move(impl)),
        spec_{in_channels, height, width, std::nullopt, {}, {}},
        num_classes_(num_classes),
        dropout_(dropout) {}

  at::Tensor forward(const at::Tensor& x) override { return impl_->forward(x); }
  InputSpec input_spec() const override { return spec_; }
  std::string describe() const override {
    return fmt::format("fmnist_cnn (4× conv3x3-BN-ReLU, 2 max-pools, fc {}→256→{}, dropout {})",
                       64 * (spec_.height / 4) * (spec_.width / 4), num_classes_, dropout_);
  }

 private:
  std::shared_ptr<FmnistCnnImpl> impl_;
  InputSpec spec_;
  int64_t num_classes_;
  double dropout_;
};

std::unique_ptr<Model> make_fmnist_cnn(const ModelBuild& b) {
  if (b.height < 4 || b.width < 4 || b.height % 4 != 0 || b.width % 4 != 0) {
    throw bad_input("model fmnist_cnn needs height and width divisible by 4 (two 2×2 max-pools), the data gives "
                    "{}x{}",
                    b.height, b.width);
  }
  return std::make_unique<FmnistCnn>(b.in_channels, b.height, b.width, b.num_classes, b.options.dropout);
}

// A detector from the [model] keys (model_options.h's DetectorSettings) and the data's classes.
std::unique_ptr<Model> make_detector(const std::string& kind, int depth, const ModelBuild& b) {
  if (b.in_channels != 3) {
    throw bad_input("model.name = \"{}_resnet{}_fpn\" takes RGB images; the data have {} channel(s)", kind, depth,
                    b.in_channels);
  }
  const DetectorSettings& s = b.options.detector;
  DetectorOptions o;
  o.num_classes = b.num_classes;
  o.min_size = s.min_size;
  o.max_size = s.max_size;
  // torchvision's rule (_validate_trainable_layers, norm_layer): FrozenBatchNorm2d and the
  // configured stages over loaded weights; BatchNorm2d and every stage from scratch.
  const bool weights = !b.options.init.empty();
  o.frozen_norm = s.backbone_norm == "frozen" || (s.backbone_norm == "auto" && weights);
  o.trainable_backbone_layers = s.backbone_norm == "auto" && !weights ? 5 : s.trainable_backbone_layers;
  const bool fcos = kind == "fcos";
  o.score_thresh = s.score_thresh >= 0 ? s.score_thresh : (fcos ? 0.2 : 0.05);
  o.nms_thresh = s.nms_thresh >= 0 ? s.nms_thresh : (fcos ? 0.6 : 0.5);
  o.detections_per_img = s.detections_per_img;
  o.topk_candidates = s.topk_candidates;
  o.center_sampling_radius = s.center_sampling_radius;
  if (fcos) return make_fcos(depth, o);
  return make_retinanet(depth, o);
}

}  // namespace

const Registry<ModelFactory>& model_registry() {
  static const Registry<ModelFactory> registry = [] {
    Registry<ModelFactory> r("model");
    r.add("fmnist_cnn", "the default job's CNN: 4 conv3x3-BN-ReLU, 2 max-pools, 2 linear layers", make_fmnist_cnn);
    for (int depth : {18, 34, 50}) {
      r.add(fmt::format("resnet{}", depth), fmt::format("torchvision's ResNet-{} (same names and init)", depth),
            [depth](const ModelBuild& b) { return make_resnet(depth, b.in_channels, b.num_classes); });
    }
    r.add("exported", "a Python model exported by torch.export (model.path: a .pt2 of crucible.export or torch.export.save)",
          make_exported);
    r.add("torchscript", "a Python model saved by torch.jit.save(torch.jit.script(m)) (model.path)", make_torchscript);
    for (const char* kind : {"fcos", "retinanet"}) {
      for (int depth : {18, 34, 50}) {
        r.add(fmt::format("{}_resnet{}_fpn", kind, depth),
              fmt::format("torchvision's {}_resnet50_fpn over ResNet-{} (same state_dict names)", kind, depth),
              [kind = std::string(kind), depth](const ModelBuild& b) { return make_detector(kind, depth, b); });
      }
    }
    return r;
  }();
  return registry;
}

std::unique_ptr<Model> make_model(const ModelOptions& options, int64_t in_channels, int64_t height, int64_t width,
                                  int64_t num_classes) {
  return model_registry().get(options.name, "model.name").factory({options, in_channels, height, width, num_classes});
}

InputSpec InputSpec::trained_on(const data::InputConvention& delivered) const {
  InputSpec s = *this;
  s.order = delivered.order;
  s.mean = delivered.mean;
  s.std = delivered.std;
  return s;
}

std::string InputSpec::to_json() const {
  nlohmann::json j = {{"channels", channels}, {"height", height}, {"width", width}, {"mean", mean}, {"std", std}};
  j["order"] = order ? nlohmann::json(data::color_order_name(*order)) : nlohmann::json(nullptr);
  return j.dump();
}

InputSpec InputSpec::from_json(const std::string& text, const std::string& source) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    InputSpec s;
    s.channels = j.at("channels").get<int64_t>();
    s.height = j.at("height").get<int64_t>();
    s.width = j.at("width").get<int64_t>();
    if (!j.at("order").is_null()) {
      const std::string order = j.at("order").get<std::string>();
      s.order = order == data::color_order_name(data::ColorOrder::kGray) ? data::ColorOrder::kGray
                                                                         : data::parse_color_order(order, source);
    }
    s.mean = j.at("mean").get<std::vector<double>>();
    s.std = j.at("std").get<std::vector<double>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("{}: the model's input spec is not readable: {} ({})", source, e.what(), text);
  }
}

std::string InputSpec::describe() const {
  if (!order) return fmt::format("{} channel{} (any order and normalisation)", channels, channels == 1 ? "" : "s");
  return fmt::format("{} channel{} ({}), normalised with mean [{}] std [{}] (0–1 units)", channels,
                     channels == 1 ? "" : "s", data::color_order_name(*order), fmt::join(mean, ", "),
                     fmt::join(std, ", "));
}

void check_input(const InputSpec& expected, const data::InputConvention& delivered, const std::string& model) {
  if (expected.channels != delivered.channels) {
    throw bad_input("{} takes {} channel(s) but the data pipeline delivers {} ({})", model, expected.channels,
                    delivered.channels, delivered.describe());
  }
  if (!expected.order) return;  // not trained yet: it takes what it is given
  if (*expected.order != delivered.order) {
    throw bad_input("{} was trained on {} images but the pipeline delivers {}; set data.color_order = \"{}\"", model,
                    data::color_order_name(*expected.order), data::color_order_name(delivered.order),
                    data::color_order_name(*expected.order));
  }
  bool same = expected.mean.size() == delivered.mean.size() && expected.std.size() == delivered.std.size();
  for (size_t i = 0; same && i < expected.mean.size(); ++i) {
    same = std::abs(expected.mean[i] - delivered.mean[i]) <= 1e-6 && std::abs(expected.std[i] - delivered.std[i]) <= 1e-6;
  }
  if (!same) {
    throw bad_input("{} was trained on inputs normalised with mean [{}] std [{}] (0–1 units) but the pipeline "
                    "normalises with mean [{}] std [{}]; set data.mean/data.std (and data.mean_std_range) to the "
                    "training values",
                    model, fmt::join(expected.mean, ", "), fmt::join(expected.std, ", "), fmt::join(delivered.mean, ", "),
                    fmt::join(delivered.std, ", "));
  }
}

ModuleModel::ModuleModel(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}

std::vector<NamedTensor> ModuleModel::named_parameters() {
  std::vector<NamedTensor> out;
  for (const auto& p : module_->named_parameters(/*recurse=*/true)) out.push_back({p.key(), p.value()});
  return out;
}

std::vector<NamedTensor> ModuleModel::named_buffers() {
  std::vector<NamedTensor> out;
  for (const auto& b : module_->named_buffers(/*recurse=*/true)) out.push_back({b.key(), b.value()});
  return out;
}

void ModuleModel::train(bool on) { module_->train(on); }
bool ModuleModel::is_training() const { return module_->is_training(); }
void ModuleModel::to(c10::Device device) { module_->to(device); }

void to_channels_last(Model& model) {
  // set_data keeps the tensor (and its autograd identity) and swaps its storage, so this works
  // on a torch::nn module's parameters and on a TorchScript module's alike.
  for (auto& p : model.named_parameters()) {
    if (p.tensor.dim() == 4) p.tensor.set_data(p.tensor.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
}

int64_t parameter_count(Model& model) {
  int64_t n = 0;
  for (const auto& p : model.named_parameters()) n += p.tensor.numel();
  return n;
}

torch::nn::Module& require_nn_module(Model& model, const std::string& feature) {
  torch::nn::Module* m = model.nn_module();
  if (m == nullptr) {
    throw bad_input("{} needs a model built from crucible's torch::nn modules; {} is not one", feature,
                    model.describe());
  }
  return *m;
}

}  // namespace crucible::nn
