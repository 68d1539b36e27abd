// histogram_of (see histogram.h).
#include "crucible/obs/histogram.h"

#include <ATen/ATen.h>

#include "crucible/core/host_read.h"

namespace crucible::obs {

obs::Histogram histogram_of(const at::Tensor& t, int bins) {
  at::NoGradGuard no_grad;
  at::Tensor v = t.detach().reshape({-1}).to(at::kDouble);
  v = v.masked_select(at::isfinite(v));
  obs::Histogram h;
  h.num = static_cast<double>(v.numel());
  if (v.numel() == 0) return h;
  const std::vector<double> stats =
      host_values(at::stack({v.min(), v.max(), v.sum(), v.pow(2).sum()}), HostRead::kHistogram);
  h.min = stats[0];
  h.max = stats[1];
  h.sum = stats[2];
  h.sum_squares = stats[3];
  if (h.min == h.max) {  // one value: one bucket holding all of it
    h.limits = {h.max};
    h.counts = {h.num};
    return h;
  }
  const std::vector<double> c = host_values(at::histc(v, bins, h.min, h.max), HostRead::kHistogram);
  const double width = (h.max - h.min) / bins;
  for (int i = 0; i < bins; ++i) {
    h.limits.push_back(i + 1 == bins ? h.max : h.min + width * (i + 1));
    h.counts.push_back(c[i]);
  }
  return h;
}

}  // namespace crucible::obs
