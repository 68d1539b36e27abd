// Model zoo: ResNet-18/34/50 in torchvision's exact layout (torchvision.models.resnetNN), so
// torchvision state_dicts load by name with no renaming and forwards agree. Light header: the
// modules live in src/nn/resnet.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "crucible/nn/model.h"

namespace crucible::nn {

// torchvision.models.resnet{18,34,50}(num_classes=num_classes), built in C++:
// - parameters and buffers have torchvision's state_dict names, shapes and order (conv1, bn1,
//   layer1.0.conv1, …, layer2.0.downsample.0/1, fc; BN weight, bias, running_mean, running_var,
//   num_batches_tracked). The BatchNorms are crucible::nn::BatchNorm2d (same names; can become
//   SyncBatchNorm);
// - ResNet-50 is v1.5: the stride of a downsampling Bottleneck is on its 3×3 conv2;
// - initialisation as torchvision with zero_init_residual=False: convs kaiming_normal_
//   (fan_out, relu), BN weight 1 and bias 0, fc torch's Linear default; the default CPU
//   generator is drawn from in torchvision's sequence, so the same seed gives the same weights
//   (bit for bit; tests/nn/resnet_test.cpp checks it);
// - in_channels other than 3 changes only conv1's input channels.
// Input: [batch, in_channels, height, width] float → [batch, num_classes] logits. The input
// spec states 224×224 (what torchvision's weights were trained at), but any size works through
// the adaptive average pool; from 32×32 down the feature map before the pool is 1×1.
// Weights come from torch's default CPU generator (seed it first). Throws bad_input for a depth
// other than 18, 34 or 50, or for in_channels or num_classes below 1.
std::unique_ptr<Model> make_resnet(int depth, int64_t in_channels, int64_t num_classes);

// A detector's trunk: torchvision's resnet{18,34,50}(norm_layer=FrozenBatchNorm2d) as
// IntermediateLayerGetter keeps it (conv1, bn1, layer1 … layer4; no avgpool, no fc), with
// torchvision's state_dict names below the prefix its owner registers it under ("body.").
// `frozen`: FrozenBatchNorm2d (the default, as over pretrained weights), else BatchNorm2d.
std::shared_ptr<torch::nn::Module> make_resnet_trunk(int depth, bool frozen = true);
// The outputs of the trunk's layer1 … layer4 for `x`.
std::vector<at::Tensor> resnet_trunk_stages(torch::nn::Module& trunk, const at::Tensor& x);

}  // namespace crucible::nn
