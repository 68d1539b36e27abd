// libtorch version shims (see compat.h).
#include "crucible/core/compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cstdlib>
#include <mutex>

#if defined(CRUCIBLE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
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

void release_cached_memory(c10::Device device) {
#if defined(CRUCIBLE_WITH_CUDA)
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;  // CPU memory goes back to malloc as tensors die; nothing is cached
#endif
}

void set_deterministic(bool on) { at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false); }

void set_matmul_precision(const std::string& precision) { at::globalContext().setFloat32MatmulPrecision(precision); }

void set_cudnn_benchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }

void enable_sync_debug() { ::setenv("CUDA_LAUNCH_BLOCKING", "1", /*overwrite=*/1); }

void set_num_threads(int threads) { at::set_num_threads(threads); }
int num_threads() { return at::get_num_threads(); }

}  // namespace crucible::compat
