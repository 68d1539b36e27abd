// Element types of array files, independent of torch (the torch mapping is in io/tensor.h):
// every NumPy numeric type, bfloat16 and the float8 types of safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace crucible::io {

enum class DType : uint8_t {
  kBool, kU8, kI8, kI16, kI32, kI64, kU16, kU32, kU64,
  kF16, kBF16, kF32, kF64, kC64, kC128, kF8E5M2, kF8E4M3,
};

size_t dtype_size(DType t);
// NumPy-style name: "uint8", "float32", "bfloat16", "complex64", "float8_e4m3", …
const char* dtype_name(DType t);
// safetensors name ("U8", "F32", "BF16", …); nullptr for types safetensors lacks (complex).
const char* dtype_safetensors_name(DType t);
bool dtype_from_safetensors_name(const std::string& name, DType* out);
// Parses a NumPy-style name as given on a command line: "float32", "f4", "<f4", "uint16",
// "u2", "bool", "complex64", … (byte-order prefixes other than little are refused).
bool dtype_from_name(const std::string& name, DType* out);

bool dtype_is_float(DType t);    // f16, bf16, f32, f64, f8*
bool dtype_is_complex(DType t);  // c64, c128

// Product of dims as a byte count for `t`, or throws bad_input (naming `what`) on a negative
// dim or an overflow of 63 bits.
uint64_t checked_nbytes(const int64_t* dims, size_t ndim, DType t, const std::string& what);

}  // namespace crucible::io
