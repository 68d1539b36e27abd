// LayerProfiler (see layer_profile.h): a global RecordFunction callback on user scopes (the
// layers), operators (to learn which layer each autograd sequence number belongs to) and
// backward nodes (timed, and given to the layer by their sequence number).
#include "crucible/obs/layer_profile.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <ATen/record_function.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/nn/layer_scope.h"

namespace crucible::obs {
namespace {

using Clock = std::chrono::steady_clock;

struct Started : at::ObserverContext {
  Clock::time_point at;
  int layer = -1;  // index into Impl::layers; -2: a backward node no layer created
};

// The layer whose forward is running on this thread (-1: none).
thread_local int t_current_layer = -1;

}  // namespace

struct LayerProfiler::Impl {
  static std::atomic<Impl*> g_active;  // the one profiler the callbacks report to
  c10::Device device{c10::kCPU};
  std::atomic<bool> armed{false};
  at::CallbackHandle handle = 0;
  mutable std::mutex mu;
  std::vector<LayerTime> layers;                // in first-forward order
  std::unordered_map<std::string, int> index;   // name → position in layers
  std::unordered_map<int64_t, int> seq_layer;   // autograd sequence number → layer (this step)
  LayerTime outside{kOutsideLayers};

  void sync() const {
    if (device.is_cuda()) compat::synchronize(device);
  }

  int layer_index(const char* scope) {
    std::lock_guard<std::mutex> lock(mu);
    const std::string name(scope + std::strlen(nn::kLayerScopePrefix));
    auto it = index.find(name);
    if (it != index.end()) return it->second;
    layers.push_back(LayerTime{name});
    index.emplace(name, static_cast<int>(layers.size() - 1));
    return static_cast<int>(layers.size() - 1);
  }

  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    Impl* self = g_active.load(std::memory_order_acquire);
    if (self == nullptr || !self->armed.load(std::memory_order_relaxed)) return nullptr;
    switch (fn.scope()) {
      case at::RecordScope::USER_SCOPE: {
        const char* name = fn.name();
        if (std::strncmp(name, nn::kLayerScopePrefix, std::strlen(nn::kLayerScopePrefix)) != 0) return nullptr;
        auto s = std::make_unique<Started>();
        s->layer = self->layer_index(name);
        t_current_layer = s->layer;
        self->sync();
        s->at = Clock::now();
        return s;
      }
      case at::RecordScope::FUNCTION: {
        // A forward operator inside a layer: the node it creates (if any) has this sequence
        // number. The last layer to see a number is the one that created its node (the number
        // advances as the node is made), hence last-writer-wins.
        if (t_current_layer >= 0 && fn.seqNr() >= 0) {
          std::lock_guard<std::mutex> lock(self->mu);
          self->seq_layer[fn.seqNr()] = t_current_layer;
        }
        return nullptr;
      }
      case at::RecordScope::BACKWARD_FUNCTION: {
        auto s = std::make_unique<Started>();
        {
          std::lock_guard<std::mutex> lock(self->mu);
          auto it = self->seq_layer.find(fn.seqNr());
          s->layer = it == self->seq_layer.end() ? -2 : it->second;
        }
        self->sync();
        s->at = Clock::now();
        return s;
      }
      default:
        return nullptr;
    }
  }

  static void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    Impl* self = g_active.load(std::memory_order_acquire);
    if (self == nullptr || ctx == nullptr) return;
    auto* s = static_cast<Started*>(ctx);
    self->sync();
    const double dt = std::chrono::duration<double>(Clock::now() - s->at).count();
    std::lock_guard<std::mutex> lock(self->mu);
    if (fn.scope() == at::RecordScope::USER_SCOPE) {
      t_current_layer = -1;
      LayerTime& l = self->layers[static_cast<size_t>(s->layer)];
      l.forward_seconds += dt;
      ++l.forward_calls;
    } else {
      LayerTime& l = s->layer >= 0 ? self->layers[static_cast<size_t>(s->layer)] : self->outside;
      l.backward_seconds += dt;
    }
  }
};

std::atomic<LayerProfiler::Impl*> LayerProfiler::Impl::g_active{nullptr};

LayerProfiler::LayerProfiler(c10::Device device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  Impl* expected = nullptr;
  if (!Impl::g_active.compare_exchange_strong(expected, impl_.get())) {
    throw runtime_error("train.profile = \"full\": another layer profiler is running in this process");
  }
  impl_->handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&Impl::on_start, &Impl::on_end)
          .scopes({at::RecordScope::USER_SCOPE, at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

LayerProfiler::~LayerProfiler() {
  at::removeCallback(impl_->handle);
  Impl::g_active.store(nullptr, std::memory_order_release);
}

void LayerProfiler::arm() { impl_->armed.store(true, std::memory_order_relaxed); }

void LayerProfiler::disarm() {
  impl_->armed.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->seq_layer.clear();  // backward has run: this step's numbers are spent
}

std::vector<LayerTime> LayerProfiler::layers() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<LayerTime> out = impl_->layers;
  if (impl_->outside.backward_seconds > 0) out.push_back(impl_->outside);
  return out;
}

}  // namespace crucible::obs
