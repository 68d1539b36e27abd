// lint_bias_before_norm: siblings in registration order, recursively.
#include "crucible/nn/lint.h"

#include "crucible/nn/batch_norm.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <fmt/format.h>

namespace crucible::nn {
namespace {

namespace tnn = torch::nn;

// "Conv2d" etc. when `m` has a defined bias, else "".
std::string biased_kind(tnn::Module& m) {
  if (auto* c = dynamic_cast<tnn::Conv1dImpl*>(&m)) return c->options.bias() ? "Conv1d" : "";
  if (auto* c = dynamic_cast<tnn::Conv2dImpl*>(&m)) return c->options.bias() ? "Conv2d" : "";
  if (auto* c = dynamic_cast<tnn::Conv3dImpl*>(&m)) return c->options.bias() ? "Conv3d" : "";
  if (auto* l = dynamic_cast<tnn::LinearImpl*>(&m)) return l->options.bias() ? "Linear" : "";
  return "";
}

std::string norm_kind(tnn::Module& m) {
  if (dynamic_cast<tnn::BatchNorm1dImpl*>(&m) != nullptr) return "BatchNorm1d";
  if (dynamic_cast<tnn::BatchNorm2dImpl*>(&m) != nullptr) return "BatchNorm2d";
  if (dynamic_cast<BatchNorm2dImpl*>(&m) != nullptr) return "BatchNorm2d";
  if (dynamic_cast<tnn::BatchNorm3dImpl*>(&m) != nullptr) return "BatchNorm3d";
  return "";
}

void walk(tnn::Module& module, const std::string& prefix, std::vector<std::string>& out) {
  auto children = module.named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string name = prefix + children[i].key();
    walk(*children[i].value(), name + ".", out);
    if (i + 1 == children.size()) continue;
    const std::string kind = biased_kind(*children[i].value());
    const std::string norm = norm_kind(*children[i + 1].value());
    if (!kind.empty() && !norm.empty()) {
      out.push_back(fmt::format("{} ({} with bias) feeds {} ({}): the norm removes the bias; build {} with bias=false",
                                name, kind, prefix + children[i + 1].key(), norm, name));
    }
  }
}

}  // namespace

std::vector<std::string> lint_bias_before_norm(torch::nn::Module& module) {
  std::vector<std::string> out;
  walk(module, "", out);
  return out;
}

}  // namespace crucible::nn
