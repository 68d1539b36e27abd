// Element types of array files, independent of torch (torch mapping lives in io/tensor.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace crucible::io {

enum class DType : uint8_t { kBool, kU8, kI8, kI16, kI32, kI64, kU16, kU32, kU64, kF16, kBF16, kF32, kF64 };

size_t dtype_size(DType t);
// Short lower-case name: "uint8", "float32", "bfloat16", …
const char* dtype_name(DType t);
// safetensors names: "U8", "F32", "BF16", …
const char* dtype_safetensors_name(DType t);
// Parses a safetensors name; returns false for an unknown one.
bool dtype_from_safetensors_name(const std::string& name, DType* out);

// Product of dims as a byte count for `t`, or throws bad_input (naming `what`) on a negative
// dim or an overflow of 63 bits.
uint64_t checked_nbytes(const int64_t* dims, size_t ndim, DType t, const std::string& what);

}  // namespace crucible::io
