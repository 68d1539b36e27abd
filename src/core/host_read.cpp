// host_values and its counters (see host_read.h).
#include "crucible/core/host_read.h"

#include <atomic>

#include <ATen/ATen.h>

namespace crucible {
namespace {

std::array<std::atomic<int64_t>, kHostReadReasons>& counters() {
  static std::array<std::atomic<int64_t>, kHostReadReasons> c{};
  return c;
}

}  // namespace

const char* host_read_name(HostRead why) {
  switch (why) {
    case HostRead::kStepVote: return "step_vote";
    case HostRead::kInterval: return "interval";
    case HostRead::kSyncBnCount: return "sync_bn_count";
    case HostRead::kDiagnosis: return "diagnosis";
    case HostRead::kHistogram: return "histogram";
    case HostRead::kReplicas: return "replicas";
  }
  return "?";
}

std::vector<double> host_values(const at::Tensor& t, HostRead why) {
  counters()[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  const at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

std::array<int64_t, kHostReadReasons> host_read_counts() {
  std::array<int64_t, kHostReadReasons> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = counters()[i].load(std::memory_order_relaxed);
  return out;
}

}  // namespace crucible
