// AdamW and SGD(Nesterov), following torch/optim/adamw.py and sgd.py (_single_tensor_*).
#include "crucible/train/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"

namespace crucible::train {
namespace {

const at::Tensor* find_state(const std::vector<NamedTensor>& state, const std::string& name) {
  for (const auto& s : state) {
    if (s.name == name) return &s.tensor;
  }
  return nullptr;
}

void copy_state(const std::vector<NamedTensor>& state, const std::string& name, at::Tensor& dst) {
  const at::Tensor* src = find_state(state, name);
  if (src == nullptr) throw bad_input("optimizer state: missing tensor '{}'", name);
  if (src->sizes() != dst.sizes()) {
    throw bad_input("optimizer state: '{}' has shape [{}], the parameter needs [{}]", name, fmt::join(src->sizes(), ", "),
                    fmt::join(dst.sizes(), ", "));
  }
  at::NoGradGuard no_grad;
  dst.copy_(*src);
}

// T3: eps is added to sqrt(v) in the parameter's own precision when parameters are half or
// bfloat16; below that type's smallest normal number it rounds away and the update blows up.
double guarded_eps(double eps, const std::vector<ParamGroup>& groups) {
  double floor = 0;
  const char* type = "";
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      if (p.tensor.scalar_type() == at::kHalf && floor < 6.103515625e-05) {
        floor = 6.103515625e-05;  // smallest normal float16
        type = "float16";
      } else if (p.tensor.scalar_type() == at::kBFloat16 && floor < 1.1754943508222875e-38) {
        floor = 1.1754943508222875e-38;
        type = "bfloat16";
      }
    }
  }
  if (eps >= floor) return eps;
  log_warn("optim.eps = {} is below the smallest normal {} ({}) of the {} parameters; using {} (T3)", eps, type, floor,
           type, floor);
  return floor;
}

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimOptions& o, std::vector<ParamGroup> groups) : beta2_(o.beta2), eps_(guarded_eps(o.eps, groups)) {
    groups_ = std::move(groups);
    for (const auto& g : groups_) {
      for (const auto& p : g.params) {
        // T3: moments in fp32 whatever the parameter's type.
        auto opts = p.tensor.options().dtype(at::kFloat);
        exp_avg_.push_back(at::zeros(p.tensor.sizes(), opts).contiguous(p.tensor.suggest_memory_format()));
        exp_avg_sq_.push_back(at::zeros(p.tensor.sizes(), opts).contiguous(p.tensor.suggest_memory_format()));
      }
    }
  }

  void step(double lr, double beta1) override {
    at::NoGradGuard no_grad;
    ++step_;
    const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
    const double bias2_sqrt = std::sqrt(1.0 - std::pow(beta2_, static_cast<double>(step_)));
    const double step_size = lr / bias1;
    size_t k = 0;
    for (auto& g : groups_) {
      for (auto& p : g.params) {
        at::Tensor& m = exp_avg_[k];
        at::Tensor& v = exp_avg_sq_[k];
        ++k;
        if (!p.tensor.grad().defined()) continue;
        // T3: the update is computed in fp32 whatever the parameter's type, then rounded once
        // into it (libtorch's CPU kernels also refuse half/float mixes in one in-place op).
        const bool fp32 = p.tensor.scalar_type() == at::kFloat;
        const at::Tensor grad = fp32 ? p.tensor.grad() : p.tensor.grad().to(at::kFloat);
        at::Tensor param = fp32 ? p.tensor : p.tensor.to(at::kFloat);
        param.mul_(1.0 - lr * g.weight_decay);
        m.mul_(beta1).add_(grad, 1.0 - beta1);
        v.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
        at::Tensor denom = (v.sqrt() / bias2_sqrt).add_(eps_);
        param.addcdiv_(m, denom, -step_size);
        if (!fp32) p.tensor.copy_(param);
      }
    }
  }

  std::vector<NamedTensor> state() const override {
    std::vector<NamedTensor> out;
    out.push_back({"step", at::scalar_tensor(step_, at::kLong)});
    size_t k = 0;
    for (const auto& g : groups_) {
      for (const auto& p : g.params) {
        out.push_back({p.name + ".exp_avg", exp_avg_[k]});
        out.push_back({p.name + ".exp_avg_sq", exp_avg_sq_[k]});
        ++k;
      }
    }
    return out;
  }

  void load_state(const std::vector<NamedTensor>& state) override {
    const at::Tensor* s = find_state(state, "step");
    if (s == nullptr) throw bad_input("optimizer state: missing 'step'");
    step_ = s->item<int64_t>();
    size_t k = 0;
    for (const auto& g : groups_) {
      for (const auto& p : g.params) {
        copy_state(state, p.name + ".exp_avg", exp_avg_[k]);
        copy_state(state, p.name + ".exp_avg_sq", exp_avg_sq_[k]);
        ++k;
      }
    }
  }

  double eps() const { return eps_; }
  std::string describe() const override {
    return fmt::format("AdamW(beta2 {}, eps {}, weight decay {})", beta2_, eps_,
                       groups_.empty() ? 0.0 : groups_[0].weight_decay);
  }

 private:
  double beta2_, eps_;
  int64_t step_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimOptions& o, std::vector<ParamGroup> groups) : nesterov_(o.nesterov) {
    groups_ = std::move(groups);
    for (const auto& g : groups_) buffers_.resize(buffers_.size() + g.params.size());
  }

  void step(double lr, double momentum) override {
    at::NoGradGuard no_grad;
    size_t k = 0;
    for (auto& g : groups_) {
      for (auto& p : g.params) {
        at::Tensor& buf = buffers_[k++];
        if (!p.tensor.grad().defined()) continue;
        // As AdamW: computed in fp32, rounded once into a half/bf16 parameter (T3).
        const bool fp32 = p.tensor.scalar_type() == at::kFloat;
        const at::Tensor grad = fp32 ? p.tensor.grad() : p.tensor.grad().to(at::kFloat);
        at::Tensor param = fp32 ? p.tensor : p.tensor.to(at::kFloat);
        at::Tensor d = g.weight_decay != 0.0 ? grad.add(param, g.weight_decay) : grad;
        if (momentum != 0.0) {
          if (!buf.defined()) {
            buf = d.clone();
          } else {
            buf.mul_(momentum).add_(d);
          }
          d = nesterov_ ? d.add(buf, momentum) : buf;
        }
        param.add_(d, -lr);
        if (!fp32) p.tensor.copy_(param);
      }
    }
  }

  std::vector<NamedTensor> state() const override {
    std::vector<NamedTensor> out;
    size_t k = 0;
    for (const auto& g : groups_) {
      for (const auto& p : g.params) {
        if (buffers_[k].defined()) out.push_back({p.name + ".momentum_buffer", buffers_[k]});
        ++k;
      }
    }
    return out;
  }

  void load_state(const std::vector<NamedTensor>& state) override {
    size_t k = 0;
    for (const auto& g : groups_) {
      for (const auto& p : g.params) {
        const std::string name = p.name + ".momentum_buffer";
        const at::Tensor* s = find_state(state, name);
        if (s != nullptr && s->sizes() != p.tensor.sizes()) {
          throw bad_input("optimizer state: '{}' has shape [{}], the parameter needs [{}]", name,
                          fmt::join(s->sizes(), ", "), fmt::join(p.tensor.sizes(), ", "));
        }
        if (s != nullptr && !at::isFloatingType(s->scalar_type())) {
          throw bad_input("optimizer state: '{}' holds {}, a momentum buffer is floating point", name,
                          c10::toString(s->scalar_type()));
        }
        buffers_[k] = s != nullptr ? s->to(at::kFloat).clone() : at::Tensor();
        ++k;
      }
    }
  }

  std::string describe() const override {
    return fmt::format("SGD({}momentum, weight decay {})", nesterov_ ? "Nesterov " : "",
                       groups_.empty() ? 0.0 : groups_[0].weight_decay);
  }

 private:
  bool nesterov_;
  std::vector<at::Tensor> buffers_;
};

}  // namespace

void Optimizer::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    }
  }
}

const Registry<OptimizerKind>& optimizer_registry() {
  static const Registry<OptimizerKind> registry = [] {
    Registry<OptimizerKind> r("optimizer");
    r.add("adamw", "AdamW (decoupled weight decay), torch.optim.AdamW's update",
          {[](const OptimOptions& o, std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
             return std::make_unique<AdamW>(o, std::move(g));
           },
           [](const OptimOptions& o) { return o.beta1; }});
    r.add("sgd", "SGD with (Nesterov) momentum, torch.optim.SGD's update",
          {[](const OptimOptions& o, std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
             return std::make_unique<Sgd>(o, std::move(g));
           },
           [](const OptimOptions& o) { return o.momentum; }});
    return r;
  }();
  return registry;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimOptions& options, std::vector<ParamGroup> groups) {
  return optimizer_registry().get(options.name, "optim.name").factory.make(options, std::move(groups));
}

double optimizer_momentum(const OptimOptions& options) {
  return optimizer_registry().get(options.name, "optim.name").factory.momentum(options);
}

}  // namespace crucible::train
