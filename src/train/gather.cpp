// gather_sample_rows (see gather.h).
#include "crucible/train/gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "crucible/distributed/comm.h"

namespace crucible::train {

SampleRows gather_sample_rows(const at::Tensor& local, distributed::Comm* comm) {
  SampleRows out;
  out.width = local.size(1);
  at::Tensor all = comm != nullptr ? comm->all_gather_varying(local) : local;
  out.all = all.to(at::kCPU).contiguous();
  const int64_t rows = out.all.size(0);
  const double* r = out.all.data_ptr<double>();
  std::vector<std::pair<int64_t, int64_t>> order;  // (sample id, row)
  order.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order.emplace_back(static_cast<int64_t>(r[out.width * i]), i);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i].first == order[i - 1].first) continue;  // X2: the sampler's padding
    out.row.push_back(order[i].second);
  }
  return out;
}

}  // namespace crucible::train
