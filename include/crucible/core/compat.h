// Every libtorch version difference lives here (and in compat.cpp), behind
// TORCH_VERSION_MAJOR/MINOR; nowhere else tests the version. Supported: 1.13 to 2.x.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace crucible::compat {

// "1.13.0" etc., from the headers this was built against.
std::string torch_version();

// RAII autocast for one device type: enables mixed precision with `dtype` (bf16 or fp16) for
// its lifetime, restoring the previous state after. `enabled` false makes it a no-op.
// 1.13 uses set_enabled / set_cpu_enabled; 2.4+ uses set_autocast_enabled(device_type, …).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Undefined;
};

// Whether this libtorch has autocast for `dtype` on `device` (fp16 on CPU needs 2.x).
bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype);

// The default CPU generator (weights init, dropout): seed, and state as a uint8 tensor that
// round-trips through checkpoints.
void seed_cpu_generator(uint64_t seed);
at::Tensor cpu_generator_state();
void set_cpu_generator_state(const at::Tensor& state);
// Seeds the default generator of a GPU device (dropout on that device); no-op on CPU.
void seed_device_generator(c10::Device device, uint64_t seed);
// The default generator of `device` (the CPU's, or that GPU's, which dropout on it draws from):
// its state as a uint8 tensor that round-trips through checkpoints.
at::Tensor generator_state(c10::Device device);
void set_generator_state(c10::Device device, const at::Tensor& state);

// Scalar types that only newer libtorch has: unsigned 16/32/64-bit integers (2.3+) and float8
// e5m2 / e4m3fn (2.1+). nullopt where this libtorch lacks them.
std::optional<c10::ScalarType> unsigned_scalar_type(int bits);
std::optional<c10::ScalarType> float8_scalar_type(bool e4m3);

// "auto" → the first CUDA device when this libtorch and machine have one, else CPU; "cpu",
// "cuda", "cuda:N" as said (bad_input when CUDA is asked for and absent, naming what exists).
c10::Device resolve_device(const std::string& name);
int cuda_device_count();
// Whether this crucible was compiled with its CUDA paths (a libtorch with CUDA, and nvcc's
// toolkit at build time); the machine may still have no GPU.
bool built_with_cuda();
// Makes `device` this process's current device (T2: before any collective); no-op on CPU.
void bind_device(c10::Device device);

// Releases memory the device's caching allocator holds but no tensor uses (T13, T16); on the
// CPU, the freed heap memory glibc keeps (release_freed_host_memory). Returns the bytes released.
int64_t release_cached_memory(c10::Device device);
// The memory this process holds on `device`: the caching allocator's reserved bytes on a GPU,
// the resident set on the CPU.
int64_t held_memory_bytes(c10::Device device);

// A point on a device's timeline (a CUDA event with timing, recorded on the current stream):
// device work is timed without synchronising. null on CPU, where host clocks time the work.
class TimelineMark {
 public:
  virtual ~TimelineMark() = default;
};
std::unique_ptr<TimelineMark> record_timeline_mark(c10::Device device);
// Seconds of device timeline from `from` to `to`; waits until `to` has completed.
double timeline_seconds(TimelineMark& from, TimelineMark& to);
// Bytes the device's caching allocator holds without a tensor in them (reserved − allocated):
// what release_cached_memory gives back. 0 on CPU.
int64_t cached_memory_bytes(c10::Device device);

// Waits until the device has finished its queued work (CUDA); nothing on CPU, where work is done
// when the call returns. For timing outside the training step (bench model), never in it.
void synchronize(c10::Device device);
// The most bytes the device's allocator held in tensors since the last reset (CUDA); 0 on CPU
// (CpuMemoryBudget counts CPU tensors).
int64_t device_peak_bytes(c10::Device device);
void reset_device_peak(c10::Device device);
// M6: deterministic algorithms only (an op without one raises). On: also CUBLAS_WORKSPACE_CONFIG
// = ":4096:8" (kept if already ":4096:8" or ":16:8"), which cuBLAS reads when a handle is
// created, so call this before the first matrix product on a GPU. Returns what it did to the
// environment ("" when nothing), for the log.
std::string set_deterministic(bool on);
// T5: "highest" | "high" | "medium" (TF32 and bf16 matmuls where the device has them);
// "highest" also turns cuDNN's TF32 convolutions off (torch leaves them on by default), the
// others leave them on.
void set_matmul_precision(const std::string& precision);
// What torch will use, read back from its context (the value summary.json records).
std::string matmul_precision();
// Whether cuBLAS matmuls and cuDNN convolutions may use TF32 (read back from torch's context).
struct Tf32 {
  bool matmul = false, conv = false;
};
Tf32 tf32_in_effect();
// T9: cuDNN autotuning for fixed input shapes; cudnn_benchmark reads torch's switch back.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// T14. enable_sync_debug: kernels launch synchronously (CUDA_LAUNCH_BLOCKING=1, which the CUDA
// driver reads when it starts: call this before anything touches CUDA), and torch's runtime
// sync-debug switch (torch.cuda.set_sync_debug_mode) set to warn, so every host synchronisation
// says where it happened (T6). sync_debug_mode reads that switch back: "off", "warn" or "error";
// "unavailable" in a build without CUDA. set_sync_debug_mode sets it alone ("error": a
// synchronising call raises; the D9 test uses it to prove the batch copies never wait).
void enable_sync_debug();
std::string sync_debug_mode();
void set_sync_debug_mode(const std::string& mode);

// While alive, every CPU tensor allocation goes through a counter, and one that would take the
// live total past `budget_bytes` fails as an out-of-memory error (T16, T17: `crucible tune
// batch` on CPU). Not nestable; install from one thread, allocations may come from any.
class CpuMemoryBudget {
 public:
  explicit CpuMemoryBudget(int64_t budget_bytes);
  ~CpuMemoryBudget();
  CpuMemoryBudget(const CpuMemoryBudget&) = delete;
  CpuMemoryBudget& operator=(const CpuMemoryBudget&) = delete;
  int64_t peak_bytes() const;
  void reset_peak();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared: blocks allocated under the budget may outlive it
};

// Intra-op threads for torch kernels.
void set_num_threads(int threads);
int num_threads();

}  // namespace crucible::compat
