// SyncBatchNorm as a custom autograd function over plain ATen ops (device-generic: the fused
// batch_norm_stats/gather kernels that torch.nn.SyncBatchNorm uses are CUDA-only in 1.13).
// Forward: each rank's per-channel mean, M2 and count are all-gathered and combined exactly
// (Chan et al.'s parallel variance); backward: the per-channel sums of dy and dy·x̂ are
// all-reduced, and dx follows from the global sums. Gradients of weight and bias stay local:
// the gradient all-reduce that follows averages them like every other parameter.
#include "crucible/nn/batch_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ostream>

#include "crucible/core/error.h"
#include "crucible/core/host_read.h"

namespace crucible::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> view_shape(int64_t dim, int64_t channels) {
  std::vector<int64_t> s(static_cast<size_t>(dim), 1);
  s[1] = channels;
  return s;
}

std::vector<int64_t> reduce_dims(int64_t dim) {
  std::vector<int64_t> d = {0};
  for (int64_t i = 2; i < dim; ++i) d.push_back(i);
  return d;
}

struct SyncBatchNormFn : torch::autograd::Function<SyncBatchNormFn> {
  // running_mean/var are updated in place (not differentiated); `collective` travels as an
  // integer because AutogradContext stores IValues only.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var, double momentum,
                            double eps, int64_t collective_ptr) {
    auto* coll = reinterpret_cast<Collective*>(collective_ptr);
    const int64_t c = input.size(1);
    const auto dims = reduce_dims(input.dim());
    const auto shape = view_shape(input.dim(), c);
    const at::Tensor x = input.to(at::kFloat);
    const int64_t n_local = input.numel() / std::max<int64_t>(1, c);
    at::Tensor mean_l, var_l;
    if (n_local > 0) {
      std::tie(var_l, mean_l) = at::var_mean(x, dims, /*unbiased=*/false);
    } else {
      mean_l = at::zeros({c}, x.options());
      var_l = at::zeros({c}, x.options());
    }
    // [mean (C), M2 (C), count (1)] per rank, in double so that combining loses nothing.
    const at::Tensor count_l = at::full({1}, static_cast<double>(n_local), x.options().dtype(at::kDouble));
    const at::Tensor stats = at::cat({mean_l.to(at::kDouble), var_l.to(at::kDouble) * static_cast<double>(n_local), count_l});
    const at::Tensor all = coll->all_gather(stats);  // [ranks, 2C+1]
    const at::Tensor counts = all.select(1, 2 * c).unsqueeze(1);
    const at::Tensor total = counts.sum();
    const double n_total = host_values(total, HostRead::kSyncBnCount)[0];
    if (n_total <= 1) {
      throw bad_input("SyncBatchNorm: {} value(s) per channel over all ranks; training needs more than 1", n_total);
    }
    const at::Tensor means = all.narrow(1, 0, c);
    const at::Tensor mean = (means * counts).sum(0) / total;
    const at::Tensor m2 = all.narrow(1, c, c).sum(0) + ((means - mean).pow(2) * counts).sum(0);
    const at::Tensor var = m2 / total;
    if (running_mean.defined()) {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (n_total / (n_total - 1))).to(running_var.scalar_type()), momentum);
    }
    const at::Tensor invstd = (var + eps).rsqrt().to(at::kFloat);
    const at::Tensor meanf = mean.to(at::kFloat);
    at::Tensor y = (x - meanf.view(shape)) * invstd.view(shape);
    if (weight.defined()) y = y * weight.to(at::kFloat).view(shape) + bias.to(at::kFloat).view(shape);
    ctx->save_for_backward({input, weight, meanf, invstd});
    ctx->saved_data["collective"] = collective_ptr;
    ctx->saved_data["n_total"] = n_total;
    return y.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    auto* coll = reinterpret_cast<Collective*>(ctx->saved_data["collective"].toInt());
    const double n_total = ctx->saved_data["n_total"].toDouble();
    const int64_t c = input.size(1);
    const auto dims = reduce_dims(input.dim());
    const auto shape = view_shape(input.dim(), c);
    const at::Tensor dy = grad_outputs[0].to(at::kFloat);
    const at::Tensor xhat = (input.to(at::kFloat) - mean.view(shape)) * invstd.view(shape);
    const at::Tensor sum_dy = dy.sum(dims);
    const at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    at::Tensor global = at::cat({sum_dy, sum_dy_xhat}).to(at::kDouble);
    coll->all_reduce_sum(global);
    const at::Tensor g_dy = global.narrow(0, 0, c).to(at::kFloat) / n_total;
    const at::Tensor g_dy_xhat = global.narrow(0, c, c).to(at::kFloat) / n_total;
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(at::kFloat);
    const at::Tensor dx =
        scale.view(shape) * (dy - g_dy.view(shape) - xhat * g_dy_xhat.view(shape));
    at::Tensor dw, db;
    if (weight.defined()) {
      dw = sum_dy_xhat.to(weight.scalar_type());
      db = sum_dy.to(weight.scalar_type());
    }
    return {dx.to(input.scalar_type()), dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

BatchNorm2dImpl::BatchNorm2dImpl(int64_t num_features, double eps, double momentum)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  // Registration order and initial values as torch::nn::BatchNormImplBase::reset().
  weight = register_parameter("weight", at::ones({num_features}));
  bias = register_parameter("bias", at::zeros({num_features}));
  running_mean = register_buffer("running_mean", at::zeros({num_features}));
  running_var = register_buffer("running_var", at::ones({num_features}));
  num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
}

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << "crucible::nn::BatchNorm2d(" << num_features_ << ", eps=" << eps_ << ", momentum=" << momentum_
         << (collective_ != nullptr ? ", sync" : "") << ")";
}

at::Tensor BatchNorm2dImpl::forward(const at::Tensor& input) {
  if (input.dim() != 4) {
    throw bad_input("BatchNorm2d: expected a 4-D input [batch, {}, height, width], got {}-D", num_features_, input.dim());
  }
  if (is_training()) {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  if (collective_ == nullptr || !is_training()) {
    // What torch::nn::BatchNorm2d's forward computes.
    return at::batch_norm(input, weight, bias, running_mean, running_var, is_training(), momentum_, eps_,
                          at::globalContext().userEnabledCuDNN());
  }
  return SyncBatchNormFn::apply(input, weight, bias, running_mean, running_var, momentum_, eps_,
                                reinterpret_cast<int64_t>(collective_));
}

int convert_sync_batchnorm(torch::nn::Module& module, Collective* collective) {
  int converted = 0;
  for (const auto& item : module.named_modules()) {
    torch::nn::Module& m = *item.value();
    if (auto* bn = dynamic_cast<BatchNorm2dImpl*>(&m)) {
      bn->set_collective(collective);
      ++converted;
    } else if (m.name().find("BatchNorm") != std::string::npos) {
      throw bad_input("dist.bn = \"sync\": module '{}' is a torch BatchNorm, which crucible cannot make synchronous; "
                      "build the model with crucible::nn::BatchNorm2d, or use dist.bn = \"broadcast\" or \"average\"",
                      item.key());
    }
  }
  return converted;
}

FrozenBatchNorm2dImpl::FrozenBatchNorm2dImpl(int64_t num_features, double eps) : eps_(eps) {
  weight = register_buffer("weight", at::ones({num_features}));
  bias = register_buffer("bias", at::zeros({num_features}));
  running_mean = register_buffer("running_mean", at::zeros({num_features}));
  running_var = register_buffer("running_var", at::ones({num_features}));
}

// torchvision's forward: the reshapes first, then scale and shift.
at::Tensor FrozenBatchNorm2dImpl::forward(const at::Tensor& x) {
  const at::Tensor w = weight.reshape({1, -1, 1, 1});
  const at::Tensor b = bias.reshape({1, -1, 1, 1});
  const at::Tensor rv = running_var.reshape({1, -1, 1, 1});
  const at::Tensor rm = running_mean.reshape({1, -1, 1, 1});
  const at::Tensor scale = w * (rv + eps_).rsqrt();
  const at::Tensor shift = b - rm * scale;
  return x * scale + shift;
}

void FrozenBatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << "crucible::nn::FrozenBatchNorm2d(" << weight.size(0) << ", eps=" << eps_ << ")";
}

}  // namespace crucible::nn
