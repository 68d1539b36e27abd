// DType ↔ ScalarType and tensor ↔ bytes.
#include "crucible/io/tensor.h"

#include <ATen/ops/empty.h>

#include <cstring>

#include "crucible/core/error.h"

namespace crucible::io {

DType to_dtype(c10::ScalarType t, const std::string& what) {
  switch (t) {
    case c10::ScalarType::Bool:
      return DType::kBool;
    case c10::ScalarType::Byte:
      return DType::kU8;
    case c10::ScalarType::Char:
      return DType::kI8;
    case c10::ScalarType::Short:
      return DType::kI16;
    case c10::ScalarType::Int:
      return DType::kI32;
    case c10::ScalarType::Long:
      return DType::kI64;
    case c10::ScalarType::Half:
      return DType::kF16;
    case c10::ScalarType::BFloat16:
      return DType::kBF16;
    case c10::ScalarType::Float:
      return DType::kF32;
    case c10::ScalarType::Double:
      return DType::kF64;
    default:
      throw bad_input("{}: tensors of type {} cannot be stored", what, c10::toString(t));
  }
}

c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kBool:
      return c10::ScalarType::Bool;
    case DType::kU8:
      return c10::ScalarType::Byte;
    case DType::kI8:
      return c10::ScalarType::Char;
    case DType::kI16:
      return c10::ScalarType::Short;
    case DType::kI32:
      return c10::ScalarType::Int;
    case DType::kI64:
      return c10::ScalarType::Long;
    case DType::kF16:
      return c10::ScalarType::Half;
    case DType::kBF16:
      return c10::ScalarType::BFloat16;
    case DType::kF32:
      return c10::ScalarType::Float;
    case DType::kF64:
      return c10::ScalarType::Double;
    default:
      throw bad_input("{} has no torch tensor type in this libtorch", dtype_name(t));
  }
}

TensorBytes tensor_bytes(const std::string& name, const at::Tensor& t, at::Tensor& keep_alive) {
  keep_alive = t.device().is_cpu() ? t.contiguous() : t.to(c10::kCPU).contiguous();
  TensorBytes b;
  b.name = name;
  b.dtype = to_dtype(keep_alive.scalar_type(), name);
  b.shape.assign(keep_alive.sizes().begin(), keep_alive.sizes().end());
  b.data = keep_alive.data_ptr();
  b.nbytes = keep_alive.numel() * keep_alive.element_size();
  return b;
}

at::Tensor to_tensor(const SafetensorsFile& file, const SafetensorsFile::Entry& entry) {
  at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(to_scalar_type(entry.dtype)));
  if (entry.nbytes > 0) std::memcpy(t.data_ptr(), file.data(entry), entry.nbytes);
  return t;
}

}  // namespace crucible::io
