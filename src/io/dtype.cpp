// DType tables and overflow-checked size arithmetic.
#include "crucible/io/dtype.h"

#include <cstring>

#include "crucible/core/error.h"

namespace crucible::io {
namespace {

struct Info {
  DType type;
  size_t size;
  const char* name;
  const char* st_name;
};

constexpr Info kInfo[] = {
    {DType::kBool, 1, "bool", "BOOL"},       {DType::kU8, 1, "uint8", "U8"},
    {DType::kI8, 1, "int8", "I8"},           {DType::kI16, 2, "int16", "I16"},
    {DType::kI32, 4, "int32", "I32"},        {DType::kI64, 8, "int64", "I64"},
    {DType::kU16, 2, "uint16", "U16"},       {DType::kU32, 4, "uint32", "U32"},
    {DType::kU64, 8, "uint64", "U64"},       {DType::kF16, 2, "float16", "F16"},
    {DType::kBF16, 2, "bfloat16", "BF16"},   {DType::kF32, 4, "float32", "F32"},
    {DType::kF64, 8, "float64", "F64"},
};

const Info& info(DType t) { return kInfo[static_cast<size_t>(t)]; }

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).st_name; }

bool dtype_from_safetensors_name(const std::string& name, DType* out) {
  for (const auto& i : kInfo) {
    if (name == i.st_name) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

uint64_t checked_nbytes(const int64_t* dims, size_t ndim, DType t, const std::string& what) {
  unsigned __int128 n = dtype_size(t);
  for (size_t i = 0; i < ndim; ++i) {
    if (dims[i] < 0) throw bad_input("{}: dimension {} is negative ({})", what, i, dims[i]);
    n *= static_cast<uint64_t>(dims[i]);
    if (n > static_cast<unsigned __int128>(INT64_MAX)) {
      throw bad_input("{}: shape too large: the byte count overflows 63 bits at dimension {}", what, i);
    }
  }
  return static_cast<uint64_t>(n);
}

}  // namespace crucible::io
