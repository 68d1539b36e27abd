// Array: a typed n-d array read from a file, torch-free. Elements are in native byte order;
// `strides` (in elements) describe the layout, so Fortran-order files and views into shared
// PyTorch storages need no copy. `owner` keeps the bytes alive: a MappedFile (D13: no copy),
// a heap buffer, or a decompressed zip member. Immutable; thread-safe to share.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crucible/io/dtype.h"

namespace crucible {
class AtomicFile;
}

namespace crucible::io {

struct Array {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; same length as shape
  const uint8_t* data = nullptr;  // element [0, 0, …]
  std::shared_ptr<const void> owner;

  int64_t numel() const;
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }
  bool is_c_contiguous() const;
  // The elements in C order as one byte string (a copy; or a view when already contiguous
  // through `contiguous()`).
  std::vector<uint8_t> c_order_bytes() const;
  // This array if C-contiguous, else a C-order copy.
  Array contiguous() const;
  std::string shape_string() const;  // "[3, 4]", "[]" for 0-d

  // An array owning `bytes` (C order, native byte order).
  static Array owned(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  // C-order strides for `shape`.
  static std::vector<int64_t> c_strides(const std::vector<int64_t>& shape);
};

// A named array, as in npz members, safetensors entries and flattened state_dicts.
struct NamedArray {
  std::string name;
  Array array;
};

// Calls fn(index, value) for every element in C order, converted to double (every dtype but
// complex; bool → 0/1; float8 and bfloat16 decoded). Throws bad_input naming `what` for complex.
void for_each_double(const Array& array, const std::string& what, const std::function<void(int64_t, double)>& fn);

// Appends the elements of `array` in C order to `file` (no copy when already contiguous).
void write_c_order(AtomicFile& file, const Array& array);

// Reverses the bytes of each `itemsize`-byte element in place (complex: each half).
void byteswap(uint8_t* data, uint64_t count, DType dtype);

}  // namespace crucible::io
