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
  const char* st_name;  // safetensors
  const char* short_name;  // NumPy kind + size
};

constexpr Info kInfo[] = {
    {DType::kBool, 1, "bool", "BOOL", "b1"},        {DType::kU8, 1, "uint8", "U8", "u1"},
    {DType::kI8, 1, "int8", "I8", "i1"},            {DType::kI16, 2, "int16", "I16", "i2"},
    {DType::kI32, 4, "int32", "I32", "i4"},         {DType::kI64, 8, "int64", "I64", "i8"},
    {DType::kU16, 2, "uint16", "U16", "u2"},        {DType::kU32, 4, "uint32", "U32", "u4"},
    {DType::kU64, 8, "uint64", "U64", "u8"},        {DType::kF16, 2, "float16", "F16", "f2"},
    {DType::kBF16, 2, "bfloat16", "BF16", nullptr}, {DType::kF32, 4, "float32", "F32", "f4"},
    {DType::kF64, 8, "float64", "F64", "f8"},       {DType::kC64, 8, "complex64", nullptr, "c8"},
    {DType::kC128, 16, "complex128", nullptr, "c16"}, {DType::kF8E5M2, 1, "float8_e5m2", "F8_E5M2", nullptr},
    {DType::kF8E4M3, 1, "float8_e4m3", "F8_E4M3", nullptr},
};

const Info& info(DType t) { return kInfo[static_cast<size_t>(t)]; }

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).st_name; }

bool dtype_from_safetensors_name(const std::string& name, DType* out) {
  for (const auto& i : kInfo) {
    if (i.st_name != nullptr && name == i.st_name) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

bool dtype_from_name(const std::string& raw, DType* out) {
  std::string name = raw;
  if (!name.empty() && (name[0] == '<' || name[0] == '|' || name[0] == '=')) name = name.substr(1);
  static const struct {
    const char* alias;
    DType type;
  } kAliases[] = {{"float", DType::kF64}, {"double", DType::kF64}, {"half", DType::kF16}, {"int", DType::kI64},
                  {"uint", DType::kU64},  {"?", DType::kBool},     {"f", DType::kF32},    {"d", DType::kF64}};
  for (const auto& a : kAliases) {
    if (name == a.alias) {
      *out = a.type;
      return true;
    }
  }
  for (const auto& i : kInfo) {
    if (name == i.name || (i.short_name != nullptr && name == i.short_name)) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

bool dtype_is_float(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64 || t == DType::kF8E5M2 ||
         t == DType::kF8E4M3;
}

bool dtype_is_complex(DType t) { return t == DType::kC64 || t == DType::kC128; }

uint64_t checked_nbytes(const int64_t* dims, size_t ndim, DType t, const std::string& what) {
  unsigned __int128 n = dtype_size(t);
  bool zero = false;
  for (size_t i = 0; i < ndim; ++i) {
    if (dims[i] < 0) throw bad_input("{}: dimension {} is negative ({})", what, i, dims[i]);
    if (dims[i] == 0) zero = true;
    if (!zero) {
      n *= static_cast<uint64_t>(dims[i]);
      if (n > static_cast<unsigned __int128>(INT64_MAX)) {
        throw bad_input("{}: shape too large: the byte count overflows 63 bits at dimension {}", what, i);
      }
    }
  }
  return zero ? 0 : static_cast<uint64_t>(n);
}

}  // namespace crucible::io
