// Bridge between file arrays and torch tensors (tier 2: ATen/core/Tensor.h only). A tensor made
// from an Array views its bytes — the memory-mapped file itself for .npy, raw and safetensors
// (D13) — and keeps them alive; nothing is copied until a page is touched.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "crucible/io/array.h"
#include "crucible/io/dtype.h"
#include "crucible/io/safetensors.h"

namespace crucible::io {

// Throws bad_input naming `what` for a dtype with no file equivalent.
DType to_dtype(c10::ScalarType t, const std::string& what);
// Throws bad_input naming `what` when this libtorch has no such type (e.g. uint16 before 2.3).
c10::ScalarType to_scalar_type(DType t, const std::string& what = "array");

// A CPU tensor viewing `array` (same strides; no copy). The tensor keeps array.owner alive.
at::Tensor to_tensor(const Array& array, const std::string& what = "array");
// Maps a .npy file and returns it as a tensor without copying (D13).
at::Tensor load_npy_tensor(const std::string& path);

// An Array viewing a CPU tensor's elements (made contiguous on CPU first if needed); the Array
// keeps the tensor alive.
Array to_array(const at::Tensor& tensor, const std::string& what);

// A view of a CPU tensor's bytes for writing (made contiguous into `keep_alive` if needed).
TensorBytes tensor_bytes(const std::string& name, const at::Tensor& t, at::Tensor& keep_alive);

}  // namespace crucible::io
