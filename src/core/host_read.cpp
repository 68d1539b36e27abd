// host_values and its counters (see host_read.h).
#include "crucible/core/host_read.h"

#include <atomic>
#include <stdexcept>

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

void PackedValues::add(const std::string& name, const at::Tensor& values) {
  const at::Tensor flat = values.to(at::kDouble).reshape({-1});
  const size_t offset = entries_.empty() ? 0 : entries_.back().offset + entries_.back().size;
  entries_.push_back({name, offset, static_cast<size_t>(flat.numel())});
  parts_.push_back(flat);
  packed_ = at::Tensor();
}

at::Tensor& PackedValues::packed() {
  if (!packed_.defined()) packed_ = at::cat(parts_);
  return packed_;
}

void PackedValues::read(HostRead why) { host_ = host_values(packed(), why); }

const PackedValues::Entry& PackedValues::entry(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) {
      if (host_.size() < e.offset + e.size) throw std::logic_error("PackedValues: " + name + " read before read()");
      return e;
    }
  }
  throw std::logic_error("PackedValues: no entry " + name);
}

std::vector<double> PackedValues::values(const std::string& name) const {
  const Entry& e = entry(name);
  return std::vector<double>(host_.begin() + static_cast<std::ptrdiff_t>(e.offset),
                             host_.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size));
}

double PackedValues::value(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.size != 1) throw std::logic_error("PackedValues: " + name + " holds " + std::to_string(e.size) + " values");
  return host_[e.offset];
}

std::array<int64_t, kHostReadReasons> host_read_counts() {
  std::array<int64_t, kHostReadReasons> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = counters()[i].load(std::memory_order_relaxed);
  return out;
}

}  // namespace crucible
