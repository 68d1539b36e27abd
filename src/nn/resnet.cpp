// Model zoo: torchvision's ResNet-18/34/50 (torchvision/models/resnet.py, v0.14) layer for
// layer: same module tree, names, registration order, forward and initialisation, with the
// generator drawn from in the same sequence (every module's default init while building, fc
// last; then kaiming_normal_ over the convs in registration order), so one seed gives the same
// weights in Python and here.
#include "crucible/nn/resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <array>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/layer_scope.h"

namespace crucible::nn {
namespace {

namespace tnn = torch::nn;
namespace F = torch::nn::functional;

at::Tensor relu_(const at::Tensor& x) {
  return F::relu(x, F::ReLUFuncOptions().inplace(true));
}

tnn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return tnn::Conv2d(tnn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

tnn::Conv2d conv1x1(int64_t in, int64_t out, int64_t stride) {
  return tnn::Conv2d(tnn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

// The norm layer after each conv: BatchNorm2d (classification, can become SyncBatchNorm) or
// FrozenBatchNorm2d (a detector's trunk: torchvision's norm_layer=FrozenBatchNorm2d).
tnn::AnyModule norm(bool frozen, int64_t channels) {
  return frozen ? tnn::AnyModule(FrozenBatchNorm2d(channels)) : tnn::AnyModule(BatchNorm2d(channels));
}

// Two 3×3 convs; the stride (when downsampling) on conv1. Children: conv1, bn1, conv2, bn2,
// downsample (if any).
struct BasicBlockImpl : tnn::Module {
  static constexpr int64_t kExpansion = 1;

  // `downsample` is built by the caller first (torchvision's generator order); null: none.
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride, tnn::Sequential downsample_, bool frozen)
      : conv1(register_module("conv1", conv3x3(inplanes, planes, stride))),
        bn1(norm(frozen, planes)),
        conv2(conv3x3(planes, planes, 1)),
        bn2(norm(frozen, planes)),
        downsample(std::move(downsample_)) {
    register_module("bn1", bn1.ptr());
    register_module("conv2", conv2);
    register_module("bn2", bn2.ptr());
    if (!downsample.is_empty()) register_module("downsample", downsample);
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor out = relu_(bn1.forward(conv1(x)));
    out = bn2.forward(conv2(out));
    out += downsample.is_empty() ? x : downsample->forward(x);
    return relu_(out);
  }

  tnn::Conv2d conv1;
  tnn::AnyModule bn1;
  tnn::Conv2d conv2;
  tnn::AnyModule bn2;
  tnn::Sequential downsample;
};
TORCH_MODULE(BasicBlock);

// 1×1 reduce, 3×3, 1×1 expand (×4). ResNet v1.5: the stride is on the 3×3 conv2, not on conv1
// as in the paper. Children: conv1, bn1, conv2, bn2, conv3, bn3, downsample (if any).
struct BottleneckImpl : tnn::Module {
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride, tnn::Sequential downsample_, bool frozen)
      : conv1(register_module("conv1", conv1x1(inplanes, planes, 1))),
        bn1(norm(frozen, planes)),
        conv2(conv3x3(planes, planes, stride)),
        bn2(norm(frozen, planes)),
        conv3(conv1x1(planes, planes * kExpansion, 1)),
        bn3(norm(frozen, planes * kExpansion)),
        downsample(std::move(downsample_)) {
    register_module("bn1", bn1.ptr());
    register_module("conv2", conv2);
    register_module("bn2", bn2.ptr());
    register_module("conv3", conv3);
    register_module("bn3", bn3.ptr());
    if (!downsample.is_empty()) register_module("downsample", downsample);
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor out = relu_(bn1.forward(conv1(x)));
    out = relu_(bn2.forward(conv2(out)));
    out = bn3.forward(conv3(out));
    out += downsample.is_empty() ? x : downsample->forward(x);
    return relu_(out);
  }

  tnn::Conv2d conv1;
  tnn::AnyModule bn1;
  tnn::Conv2d conv2;
  tnn::AnyModule bn2;
  tnn::Conv2d conv3;
  tnn::AnyModule bn3;
  tnn::Sequential downsample;
};
TORCH_MODULE(Bottleneck);

// conv7×7/2-BN-ReLU, maxpool 3×3/2, four stages (64, 128, 256, 512 planes; stride 1, 2, 2, 2),
// global average pool, fc. Children: conv1, bn1, layer1…layer4, fc. num_classes 0: a detector's
// trunk (torchvision's IntermediateLayerGetter over the ResNet: no pool, no fc), with
// FrozenBatchNorm2d when `frozen`.
struct ResNetImpl : tnn::Module {
  template <typename Block>
  ResNetImpl(Block /*tag*/, const std::array<int, 4>& blocks, int64_t in_channels, int64_t num_classes,
             bool frozen = false) {
    // Built in torchvision's order (a stage's downsample before its first block). What the seed
    // gives depends on fc coming last: the convs' default draws are all overwritten below.
    conv1 =
        register_module("conv1", tnn::Conv2d(tnn::Conv2dOptions(in_channels, 64, 7).stride(2).padding(3).bias(false)));
    bn1 = norm(frozen, 64);
    register_module("bn1", bn1.ptr());
    int64_t inplanes = 64;
    const std::array<int64_t, 4> planes = {64, 128, 256, 512};
    for (size_t i = 0; i < 4; ++i) {
      const int64_t stride = i == 0 ? 1 : 2;
      const int64_t out = planes[i] * Block::ContainedType::kExpansion;
      tnn::Sequential layer;
      tnn::Sequential downsample{nullptr};
      if (stride != 1 || inplanes != out) {
        downsample = tnn::Sequential(conv1x1(inplanes, out, stride));
        downsample->push_back(norm(frozen, out));
      }
      layer->push_back(Block(inplanes, planes[i], stride, downsample, frozen));
      inplanes = out;
      for (int b = 1; b < blocks[i]; ++b) {
        layer->push_back(Block(inplanes, planes[i], 1, tnn::Sequential(nullptr), frozen));
      }
      layers[i] = register_module(fmt::format("layer{}", i + 1), layer);
    }
    if (num_classes > 0) fc = register_module("fc", tnn::Linear(512 * Block::ContainedType::kExpansion, num_classes));

    // torchvision's re-initialisation, in modules() order (pre-order, registration order).
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<tnn::Conv2d>()) {
        tnn::init::kaiming_normal_(conv->weight, 0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<BatchNorm2d>()) {
        tnn::init::ones_(bn->weight);
        tnn::init::zeros_(bn->bias);
      }
    }
  }

  at::Tensor forward(const at::Tensor& input) {
    std::vector<at::Tensor> stages = forward_stages(input);
    return layer("layer:fc", [&] {
      return fc(F::adaptive_avg_pool2d(stages.back(), F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1));
    });
  }

  // The outputs of layer1 … layer4.
  std::vector<at::Tensor> forward_stages(const at::Tensor& input) {
    // Each top-level child is marked for train.profile = "full" (nn/layer_scope.h).
    static constexpr std::array<const char*, 4> kScopes = {"layer:layer1", "layer:layer2", "layer:layer3",
                                                           "layer:layer4"};
    at::Tensor x = layer("layer:conv1", [&] {
      return F::max_pool2d(relu_(bn1.forward(conv1(input))), F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    });
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layer(kScopes[i], [&] { return layers[i]->forward(x); });
      out.push_back(x);
    }
    return out;
  }

  tnn::Conv2d conv1{nullptr};
  tnn::AnyModule bn1;
  std::array<tnn::Sequential, 4> layers{tnn::Sequential(nullptr), tnn::Sequential(nullptr), tnn::Sequential(nullptr),
                                        tnn::Sequential(nullptr)};
  tnn::Linear fc{nullptr};
};

class ResNet final : public ModuleModel {
 public:
  ResNet(int depth, std::shared_ptr<ResNetImpl> impl, int64_t in_channels)
      : ModuleModel(impl),
        impl_(std::move(impl)), spec_{in_channels, 224, 224, std::nullopt, {}, {}}, depth_(depth) {
    for (const auto& p : impl_->parameters()) parameters_ += p.numel();
  }

  at::Tensor forward(const at::Tensor& x) override { return impl_->forward(x); }
  InputSpec input_spec() const override { return spec_; }
  std::string describe() const override {
    return fmt::format("resnet{} (torchvision layout, {:.1f}M parameters)", depth_,
                       static_cast<double>(parameters_) / 1e6);
  }

 private:
  std::shared_ptr<ResNetImpl> impl_;
  InputSpec spec_;
  int depth_;
  int64_t parameters_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_resnet(int depth, int64_t in_channels, int64_t num_classes) {
  if (in_channels < 1 || num_classes < 1) {
    throw bad_input("resnet{}: in_channels and num_classes must be at least 1, got {} and {}", depth, in_channels,
                    num_classes);
  }
  std::shared_ptr<ResNetImpl> impl;
  switch (depth) {
    case 18:
      impl =
          std::make_shared<ResNetImpl>(BasicBlock(nullptr), std::array<int, 4>{2, 2, 2, 2}, in_channels, num_classes);
      break;
    case 34:
      impl =
          std::make_shared<ResNetImpl>(BasicBlock(nullptr), std::array<int, 4>{3, 4, 6, 3}, in_channels, num_classes);
      break;
    case 50:
      impl =
          std::make_shared<ResNetImpl>(Bottleneck(nullptr), std::array<int, 4>{3, 4, 6, 3}, in_channels, num_classes);
      break;
    default:
      throw bad_input("resnet: unknown depth {} (known: 18, 34, 50)", depth);
  }
  return std::make_unique<ResNet>(depth, std::move(impl), in_channels);
}

std::shared_ptr<torch::nn::Module> make_resnet_trunk(int depth, bool frozen) {
  switch (depth) {
    case 18:
      return std::make_shared<ResNetImpl>(BasicBlock(nullptr), std::array<int, 4>{2, 2, 2, 2}, 3, 0, frozen);
    case 34:
      return std::make_shared<ResNetImpl>(BasicBlock(nullptr), std::array<int, 4>{3, 4, 6, 3}, 3, 0, frozen);
    case 50:
      return std::make_shared<ResNetImpl>(Bottleneck(nullptr), std::array<int, 4>{3, 4, 6, 3}, 3, 0, frozen);
    default:
      throw bad_input("resnet: unknown depth {} (known: 18, 34, 50)", depth);
  }
}

std::vector<at::Tensor> resnet_trunk_stages(torch::nn::Module& trunk, const at::Tensor& x) {
  auto* impl = dynamic_cast<ResNetImpl*>(&trunk);
  if (impl == nullptr) throw runtime_error("resnet_trunk_stages: the module is not a ResNet trunk");
  return impl->forward_stages(x);
}

}  // namespace crucible::nn
