// A tensor's values as a TensorBoard histogram (obs::Histogram): `bins` equal buckets from the
// smallest value to the largest, with the count, sum and sum of squares. One host read per
// tensor: used only on the steps log.histogram_every asks for.
#pragma once

#include "crucible/obs/metric_sink.h"

namespace at {
class Tensor;
}

namespace crucible::obs {

// Non-finite values are left out. An empty tensor gives an empty histogram.
obs::Histogram histogram_of(const at::Tensor& t, int bins = 30);

}  // namespace crucible::obs
