// The one gather of per-sample results (X2/X5), shared by the Evaluator and predict: each rank
// holds rows [n, width] (double, on its device) whose column 0 is the sample id; the rows of
// every rank are gathered, ordered by sample id, and the sampler's padding (a repeated id) is
// dropped, keeping the first occurrence — the rows one process would have computed.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace crucible::distributed {
class Comm;
}

namespace crucible::train {

struct SampleRows {
  at::Tensor all;            // [m, width] double on the CPU, contiguous: every rank's rows
  std::vector<int64_t> row;  // the rows to read, one per distinct sample id, in id order
  int64_t width = 0;
  // Row i (of `row`) as a pointer to its `width` values.
  const double* operator[](size_t i) const { return all.data_ptr<double>() + width * row[i]; }
  size_t size() const { return row.size(); }
};

// `local` [n, width] double; `comm` null in a single process (then only the local rows).
SampleRows gather_sample_rows(const at::Tensor& local, distributed::Comm* comm);

}  // namespace crucible::train
