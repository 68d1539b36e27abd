// libtorch version shims (see compat.h).
#include "crucible/core/compat.h"
#include "crucible/core/memory.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>  // getNumGPUs: the same in 1.13 and 2.x
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#if defined(CRUCIBLE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "crucible/core/error.h"

namespace crucible::compat {

std::string torch_version() { return TORCH_VERSION; }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define CRUCIBLE_AUTOCAST_BY_DEVICE 1
#else
#define CRUCIBLE_AUTOCAST_BY_DEVICE 0
#endif

namespace {

bool autocast_enabled(c10::DeviceType device) {
#if CRUCIBLE_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_autocast_enabled(c10::DeviceType device, bool on) {
#if CRUCIBLE_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
#endif
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if CRUCIBLE_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if CRUCIBLE_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace

bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::BFloat16) return true;
  if (dtype == c10::ScalarType::Half) {
#if TORCH_VERSION_MAJOR >= 2
    return true;
#else
    return device != c10::DeviceType::CPU;
#endif
  }
  return false;
}

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  if (!autocast_supported(device, dtype)) {
    throw bad_input("autocast to {} on {} is not available in libtorch {}", c10::toString(dtype),
                    c10::DeviceTypeName(device), torch_version());
  }
  prev_enabled_ = autocast_enabled(device);
  prev_dtype_ = autocast_dtype(device);
  set_autocast_enabled(device, true);
  set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(device_, prev_enabled_);
  set_autocast_dtype(device_, prev_dtype_);
}

void seed_cpu_generator(uint64_t seed) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_generator_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::optional<c10::ScalarType> unsigned_scalar_type(int bits) {
  if (bits == 8) return c10::ScalarType::Byte;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  if (bits == 16) return c10::ScalarType::UInt16;
  if (bits == 32) return c10::ScalarType::UInt32;
  if (bits == 64) return c10::ScalarType::UInt64;
#endif
  return std::nullopt;
}

std::optional<c10::ScalarType> float8_scalar_type(bool e4m3) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return e4m3 ? c10::ScalarType::Float8_e4m3fn : c10::ScalarType::Float8_e5m2;
#else
  (void)e4m3;
  return std::nullopt;
#endif
}

void bind_device(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

int cuda_device_count() { return at::globalContext().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()) : 0; }

bool built_with_cuda() {
#if defined(CRUCIBLE_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

c10::Device resolve_device(const std::string& name) {
  const int gpus = cuda_device_count();
  if (name == "auto") return gpus > 0 ? c10::Device(c10::DeviceType::CUDA, 0) : c10::Device(c10::DeviceType::CPU);
  if (name == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (name.rfind("cuda", 0) == 0) {
    int index = 0;
    if (name.size() > 4) {
      if (name[4] != ':' || name.size() == 5 || name.find_first_not_of("0123456789", 5) != std::string::npos) {
        throw bad_input("train.device = \"{}\": expected cuda or cuda:N", name);
      }
      index = std::stoi(name.substr(5));
    }
    if (index >= gpus) {
      throw bad_input("train.device = \"{}\": this machine has {} CUDA device(s) visible to libtorch {}{}", name, gpus,
                      torch_version(), gpus == 0 ? " (a CPU-only build, or no GPU)" : "");
    }
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw bad_input("train.device = \"{}\": expected auto, cpu, cuda or cuda:N", name);
}

#if defined(CRUCIBLE_WITH_CUDA)
namespace {
struct CudaMark final : TimelineMark {
  at::cuda::CUDAEvent event{cudaEventDefault};  // timing on (CUDAEvent's default disables it)
};
}  // namespace
#endif

void synchronize(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

int64_t device_peak_bytes(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // [0]: all pools
  }
#else
  (void)device;
#endif
  return 0;
}

void reset_device_peak(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

std::unique_ptr<TimelineMark> record_timeline_mark(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) {
    auto mark = std::make_unique<CudaMark>();
    mark->event.record(at::cuda::getCurrentCUDAStream(device.index()));
    return mark;
  }
#else
  (void)device;
#endif
  return nullptr;
}

double timeline_seconds(TimelineMark& from, TimelineMark& to) {
#if defined(CRUCIBLE_WITH_CUDA)
  auto& a = dynamic_cast<CudaMark&>(from);
  auto& b = dynamic_cast<CudaMark&>(to);
  b.event.synchronize();
  return static_cast<double>(a.event.elapsed_time(b.event)) / 1000.0;
#else
  (void)from, (void)to;
  return 0;
#endif
}

int64_t release_cached_memory(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) {
    const int64_t before = cached_memory_bytes(device);
    c10::cuda::CUDACachingAllocator::emptyCache();
    return std::max<int64_t>(0, before - cached_memory_bytes(device));
  }
#endif
  // CPU tensors go back to malloc as they die, and glibc keeps the memory (tune_host_allocator).
  return release_freed_host_memory();
}

int64_t held_memory_bytes(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).reserved_bytes[0].current;
  }
#endif
  (void)device;
  return static_cast<int64_t>(resident_memory_bytes());
}

int64_t cached_memory_bytes(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;  // [0]: all pools
  }
#else
  (void)device;
#endif
  return 0;
}

std::string set_deterministic(bool on) {
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
  if (!on) return "";
  // cuBLAS chooses its reduction split by workspace unless this names a fixed one (M6); torch
  // raises in deterministic mode when it is unset, but only at the first product on the GPU.
  const char* was = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string old = was != nullptr ? was : "";
  if (old == ":4096:8" || old == ":16:8") return "";
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);
  return old.empty() ? "CUBLAS_WORKSPACE_CONFIG=:4096:8"
                     : fmt::format("CUBLAS_WORKSPACE_CONFIG=:4096:8 (was \"{}\", which is not deterministic)", old);
}

void set_matmul_precision(const std::string& precision) {
  at::globalContext().setFloat32MatmulPrecision(precision);
  // cuDNN's convolutions have their own TF32 switch, on in torch by default: "highest" means no
  // TF32 anywhere, so it follows the matmul precision (T5: the same rule for convs and matmuls).
  at::globalContext().setAllowTF32CuDNN(precision != "highest");
}

Tf32 tf32_in_effect() { return {at::globalContext().allowTF32CuBLAS(), at::globalContext().allowTF32CuDNN()}; }

std::string matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: return "highest";
    case at::Float32MatmulPrecision::HIGH: return "high";
    case at::Float32MatmulPrecision::MEDIUM: return "medium";
  }
  return "unknown";
}

void set_cudnn_benchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }

bool cudnn_benchmark() { return at::globalContext().benchmarkCuDNN(); }

void enable_sync_debug() {
  ::setenv("CUDA_LAUNCH_BLOCKING", "1", /*overwrite=*/1);
  set_sync_debug_mode("warn");
}

std::string sync_debug_mode() {
#if defined(CRUCIBLE_WITH_CUDA)
  switch (c10::cuda::warning_state().get_sync_debug_mode()) {
    case c10::cuda::SyncDebugMode::L_DISABLED: return "off";
    case c10::cuda::SyncDebugMode::L_WARN: return "warn";
    case c10::cuda::SyncDebugMode::L_ERROR: return "error";
  }
  return "off";
#else
  return "unavailable";
#endif
}

void set_sync_debug_mode(const std::string& mode) {
  if (mode != "off" && mode != "warn" && mode != "error") {
    throw bad_input("sync debug mode \"{}\": expected off, warn or error", mode);
  }
#if defined(CRUCIBLE_WITH_CUDA)
  using c10::cuda::SyncDebugMode;
  c10::cuda::warning_state().set_sync_debug_mode(mode == "warn"    ? SyncDebugMode::L_WARN
                                                 : mode == "error" ? SyncDebugMode::L_ERROR
                                                                   : SyncDebugMode::L_DISABLED);
#endif  // without CUDA nothing synchronises with a GPU
}

struct CpuMemoryBudget::Impl final : public c10::Allocator, public std::enable_shared_from_this<Impl> {
  c10::Allocator* inner = nullptr;
  int64_t budget = 0;
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};

  // Blocks by data pointer: libtorch's raw_allocate needs context == data, so the bookkeeping
  // cannot ride in the DataPtr's context. Entries keep their counter alive.
  struct Block {
    c10::DataPtr inner;
    int64_t bytes;
    std::shared_ptr<Impl> owner;
  };
  static std::mutex& blocks_mu() {
    static std::mutex mu;
    return mu;
  }
  static std::unordered_map<void*, Block>& blocks() {
    static std::unordered_map<void*, Block> b;
    return b;
  }

  static void release(void* data) {
    Block victim;
    {
      std::lock_guard<std::mutex> lock(blocks_mu());
      auto it = blocks().find(data);
      if (it == blocks().end()) return;
      victim = std::move(it->second);
      blocks().erase(it);
    }
    victim.owner->live.fetch_sub(victim.bytes);
  }  // victim.inner frees the memory here

  c10::DataPtr allocate_impl(size_t n) {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = live.fetch_add(bytes) + bytes;
    if (now > budget) {
      live.fetch_sub(bytes);
      throw std::runtime_error(fmt::format("out of memory: a {} byte allocation would take CPU tensors to {} bytes, "
                                           "past the budget of {}",
                                           bytes, now, budget));
    }
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    c10::DataPtr in = inner->allocate(n);
    void* data = in.get();
    {
      std::lock_guard<std::mutex> lock(blocks_mu());
      blocks()[data] = Block{std::move(in), bytes, shared_from_this()};
    }
    return c10::DataPtr(data, data, &release, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return const_cast<Impl*>(this)->allocate_impl(n); }
#endif
};

CpuMemoryBudget::CpuMemoryBudget(int64_t budget_bytes) : impl_(std::make_shared<Impl>()) {
  impl_->inner = c10::GetAllocator(c10::DeviceType::CPU);
  impl_->budget = budget_bytes;
  c10::SetAllocator(c10::DeviceType::CPU, impl_.get());
}

CpuMemoryBudget::~CpuMemoryBudget() { c10::SetAllocator(c10::DeviceType::CPU, impl_->inner); }

int64_t CpuMemoryBudget::peak_bytes() const { return impl_->peak.load(); }
void CpuMemoryBudget::reset_peak() { impl_->peak.store(impl_->live.load()); }

// Context::defaultGenerator is the same call in 1.13 and 2.x; the CUDA hook behind it was
// renamed in 2.6/2.7 (getDefaultCUDAGenerator → getDefaultGenerator, pytorch#145272).
void seed_device_generator(c10::Device device, uint64_t seed) {
  if (!device.is_cuda()) return;
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

at::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void set_num_threads(int threads) { at::set_num_threads(threads); }
int num_threads() { return at::get_num_threads(); }

}  // namespace crucible::compat
