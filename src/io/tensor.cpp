// DType ↔ ScalarType and zero-copy Array ↔ tensor.
#include "crucible/io/tensor.h"

#include <ATen/ops/from_blob.h>

#include <cstring>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/io/npy.h"

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
    case c10::ScalarType::ComplexFloat:
      return DType::kC64;
    case c10::ScalarType::ComplexDouble:
      return DType::kC128;
    default:
      break;
  }
  for (int bits : {16, 32, 64}) {
    if (compat::unsigned_scalar_type(bits) == t) return bits == 16 ? DType::kU16 : bits == 32 ? DType::kU32 : DType::kU64;
  }
  if (compat::float8_scalar_type(true) == t) return DType::kF8E4M3;
  if (compat::float8_scalar_type(false) == t) return DType::kF8E5M2;
  throw bad_input("{}: tensors of type {} cannot be stored", what, c10::toString(t));
}

c10::ScalarType to_scalar_type(DType t, const std::string& what) {
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
    case DType::kC64:
      return c10::ScalarType::ComplexFloat;
    case DType::kC128:
      return c10::ScalarType::ComplexDouble;
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
      if (auto s = compat::unsigned_scalar_type(static_cast<int>(dtype_size(t) * 8))) return *s;
      break;
    case DType::kF8E5M2:
    case DType::kF8E4M3:
      if (auto s = compat::float8_scalar_type(t == DType::kF8E4M3)) return *s;
      break;
  }
  throw bad_input("{}: libtorch {} has no {} tensors (convert the file with --dtype, e.g. int64 or float32)", what,
                  compat::torch_version(), dtype_name(t));
}

at::Tensor to_tensor(const Array& array, const std::string& what) {
  const c10::ScalarType st = to_scalar_type(array.dtype, what);
  std::shared_ptr<const void> owner = array.owner;
  // from_blob takes a mutable pointer: the bytes are a private copy-on-write mapping or a heap
  // buffer, so writes through the tensor never reach the file.
  return at::from_blob(const_cast<uint8_t*>(array.data), array.shape, array.strides,
                       [owner](void*) mutable { owner.reset(); }, at::TensorOptions().dtype(st));
}

at::Tensor load_npy_tensor(const std::string& path) { return to_tensor(read_npy(path), path); }

Array to_array(const at::Tensor& tensor, const std::string& what) {
  auto keep = std::make_shared<at::Tensor>(tensor.detach().to(c10::kCPU).contiguous());
  Array a;
  a.dtype = to_dtype(keep->scalar_type(), what);
  a.shape.assign(keep->sizes().begin(), keep->sizes().end());
  a.strides = Array::c_strides(a.shape);
  a.data = static_cast<const uint8_t*>(keep->data_ptr());
  a.owner = keep;
  return a;
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

}  // namespace crucible::io
