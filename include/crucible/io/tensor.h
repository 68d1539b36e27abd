// Bridge between file dtypes and torch tensors (tier 2: ATen/core/Tensor.h only).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "crucible/io/dtype.h"
#include "crucible/io/safetensors.h"

namespace crucible::io {

// Throws bad_input naming `what` for a dtype with no file equivalent.
DType to_dtype(c10::ScalarType t, const std::string& what);
c10::ScalarType to_scalar_type(DType t);

// A view of a CPU tensor's bytes for writing (made contiguous into `keep_alive` if needed).
TensorBytes tensor_bytes(const std::string& name, const at::Tensor& t, at::Tensor& keep_alive);

// A new CPU tensor holding a copy of an entry's bytes.
at::Tensor to_tensor(const SafetensorsFile& file, const SafetensorsFile::Entry& entry);

}  // namespace crucible::io
