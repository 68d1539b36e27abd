#include "crucible/distributed/grad_sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <thread>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/distributed/comm.h"
#include "crucible/nn/model.h"

namespace crucible::distributed {

struct GradSync::Impl {
  struct Bucket {
    std::vector<size_t> members;  // indices into params, in backward order
    int64_t numel = 0;
    int remaining = 0;            // members whose gradient is not ready yet
    at::Tensor flat;
    std::unique_ptr<Pending> pending;
  };

  Comm& comm;
  std::vector<at::Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<char> ready;
  // What grad_accumulator returns: a shared_ptr in libtorch 1.13, an intrusive_ptr in 2.x (taken
  // from the declaration itself, so no version test is needed here).
  using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<AccumulatorPtr> accumulators;  // keeps the hooks alive
  std::vector<uintptr_t> hook_keys;
  std::chrono::microseconds test_delay{0};
  std::mutex mu;
  bool communicate = true;
  size_t next_launch = 0;

  Impl(Comm& c, std::vector<at::Tensor> p) : comm(c), params(std::move(p)) {}

  void launch_locked(size_t b) {
    Bucket& k = buckets[b];
    const at::Tensor& first = params[k.members.front()];
    k.flat = at::empty({k.numel}, first.options().requires_grad(false));
    int64_t off = 0;
    for (size_t m : k.members) {
      const at::Tensor& p = params[m];
      at::Tensor slot = k.flat.narrow(0, off, p.numel()).view(p.sizes());
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        slot.copy_(g);
      } else {
        slot.zero_();  // unused on this rank: contributes nothing
      }
      off += p.numel();
    }
    k.pending = comm.all_reduce_sum_async(k.flat);
  }

  void on_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!communicate || ready[i]) return;
    ready[i] = 1;
    --buckets[bucket_of[i]].remaining;
    while (next_launch < buckets.size() && buckets[next_launch].remaining == 0) launch_locked(next_launch++);
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu);
    while (next_launch < buckets.size()) launch_locked(next_launch++);
    if (test_delay.count() > 0) std::this_thread::sleep_for(test_delay);  // a slow network, as the step sees it
    const double world = static_cast<double>(comm.size());
    at::NoGradGuard no_grad;
    for (auto& k : buckets) {
      k.pending->wait();
      k.pending.reset();
      k.flat.div_(world);
      int64_t off = 0;
      for (size_t m : k.members) {
        at::Tensor& p = params[m];
        at::Tensor avg = k.flat.narrow(0, off, p.numel()).view(p.sizes());
        if (p.grad().defined()) {
          p.mutable_grad().copy_(avg);
        } else {
          p.mutable_grad() = at::empty_like(p).copy_(avg);
        }
        off += p.numel();
      }
      k.flat = at::Tensor();
      k.remaining = static_cast<int>(k.members.size());
    }
    std::fill(ready.begin(), ready.end(), 0);
    next_launch = 0;
  }
};

namespace {

// Runs after AccumulateGrad has added this backward's gradient into .grad.
struct ReadyHook final : torch::autograd::FunctionPostHook {
  explicit ReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ready_();
    return outputs;
  }

 private:
  std::function<void()> ready_;
};

}  // namespace

GradSync::GradSync(Comm& comm, std::vector<at::Tensor> params, double bucket_mb)
    : impl_(std::make_shared<Impl>(comm, std::move(params))) {
  Impl& s = *impl_;
  const size_t n = s.params.size();
  s.bucket_of.assign(n, 0);
  s.ready.assign(n, 0);
  const double cap = bucket_mb * 1024.0 * 1024.0;
  // Reverse registration order approximates the order backward finishes gradients in.
  for (size_t j = n; j-- > 0;) {
    const at::Tensor& p = s.params[j];
    if (!p.requires_grad()) throw std::logic_error("GradSync: a parameter does not require grad");
    const bool fits = !s.buckets.empty() &&
                      s.buckets.back().members.size() > 0 &&
                      s.params[s.buckets.back().members.front()].scalar_type() == p.scalar_type() &&
                      s.params[s.buckets.back().members.front()].device() == p.device() &&
                      static_cast<double>((s.buckets.back().numel + p.numel()) * p.element_size()) <= cap;
    if (!fits) s.buckets.emplace_back();
    auto& b = s.buckets.back();
    b.members.push_back(j);
    b.numel += p.numel();
    b.remaining = static_cast<int>(b.members.size());
    s.bucket_of[j] = s.buckets.size() - 1;
  }
  for (size_t j = 0; j < n; ++j) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[j]);
    if (!acc) throw std::logic_error("GradSync: a parameter is not a leaf");
    std::weak_ptr<Impl> weak = impl_;
    s.hook_keys.push_back(acc->add_post_hook(std::make_unique<ReadyHook>([weak, j] {
      if (auto impl = weak.lock()) impl->on_ready(j);
    })));
    s.accumulators.push_back(std::move(acc));
  }
}

GradSync::~GradSync() {
  for (size_t j = 0; j < impl_->accumulators.size(); ++j) impl_->accumulators[j]->del_post_hook(impl_->hook_keys[j]);
}

void GradSync::communicate(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->communicate = on;
}

void GradSync::finish() { impl_->finish(); }

void GradSync::set_test_delay(std::chrono::microseconds delay) { impl_->test_delay = delay; }

int64_t GradSync::num_buckets() const { return static_cast<int64_t>(impl_->buckets.size()); }

std::string GradSync::describe() const {
  std::vector<std::string> sizes;
  for (const auto& b : impl_->buckets) {
    const at::Tensor& p = impl_->params[b.members.front()];
    sizes.push_back(fmt::format("{:.2f}", static_cast<double>(b.numel * p.element_size()) / (1024.0 * 1024.0)));
  }
  return fmt::format("{} bucket(s) of {} MiB over {} tensors", impl_->buckets.size(), fmt::join(sizes, ", "),
                     impl_->params.size());
}

namespace {

void broadcast_tensors(Comm& comm, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& buffers,
                       int root) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    at::Tensor t = p.data();
    comm.broadcast(t, root);
  }
  for (auto b : buffers) comm.broadcast(b, root);
}

void sync_named_buffers(Comm& comm, const std::vector<nn::NamedTensor>& buffers, const std::string& policy) {
  at::NoGradGuard no_grad;
  for (const auto& b : buffers) {
    at::Tensor t = b.tensor;
    const std::string& name = b.name;
    auto ends_with = [&name](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool statistic = ends_with("running_mean") || ends_with("running_var");
    if (policy == "average" && statistic && t.is_floating_point()) {
      comm.all_reduce_sum(t);
      t.div_(static_cast<double>(comm.size()));
    } else {
      comm.broadcast(t, 0);
    }
  }
}

std::vector<at::Tensor> tensors_of(const std::vector<nn::NamedTensor>& named) {
  std::vector<at::Tensor> out;
  for (const auto& n : named) out.push_back(n.tensor);
  return out;
}

}  // namespace

void broadcast_module(Comm& comm, torch::nn::Module& module, int root) {
  broadcast_tensors(comm, module.parameters(true), module.buffers(true), root);
}

void broadcast_module(Comm& comm, nn::Model& model, int root) {
  broadcast_tensors(comm, tensors_of(model.named_parameters()), tensors_of(model.named_buffers()), root);
}

void check_replicas_equal(Comm& comm, const std::vector<at::Tensor>& params, int64_t step) {
  if (params.empty()) return;
  at::NoGradGuard no_grad;
  at::Tensor fp = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(params.front().device()));
  for (const auto& p : params) {
    const at::Tensor d = p.detach().to(at::kDouble);
    fp[0] += d.sum();
    fp[1] += d.abs().sum();
  }
  const std::vector<double> all = host_values(comm.all_gather(fp), HostRead::kReplicas);  // [rank][2]
  for (size_t r = 1; r < all.size() / 2; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      throw runtime_error("step {}: rank {} holds different weights from rank 0 (fingerprints {:.17g}/{:.17g} vs "
                          "{:.17g}/{:.17g}); the replicas diverged",
                          step, r, all[2 * r], all[2 * r + 1], all[0], all[1]);
    }
  }
}

void sync_buffers(Comm& comm, torch::nn::Module& module, const std::string& policy) {
  std::vector<nn::NamedTensor> buffers;
  for (const auto& b : module.named_buffers(true)) buffers.push_back({b.key(), b.value()});
  sync_named_buffers(comm, buffers, policy);
}

void sync_buffers(Comm& comm, nn::Model& model, const std::string& policy) {
  sync_named_buffers(comm, model.named_buffers(), policy);
}

void sync_buffers(Comm& comm, const std::vector<nn::NamedTensor>& buffers, const std::string& policy) {
  sync_named_buffers(comm, buffers, policy);
}

}  // namespace crucible::distributed
