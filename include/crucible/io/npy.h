// NumPy .npy files, format versions 1.0, 2.0 and 3.0: every numeric dtype (bool, int8–int64,
// uint8–uint64, float16/32/64, complex64/128), either byte order (big-endian converted on
// read), C or Fortran order, 0-d and empty arrays. A native-endian file opens without a copy:
// the Array views the memory-mapped file (D13). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "crucible/io/array.h"

namespace crucible::io {

struct NpyHeader {
  DType dtype = DType::kF32;
  bool big_endian = false;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // bytes from the start of the file
  int major = 1, minor = 0;
};

// Parses the header at the start of `data`; `name` names the input in messages. Checks the
// magic, version, header length, the dict and the data size against `size`.
NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& name);

// The header alone, for a reader that has only the file's first bytes (an npz member read
// header-first): the same checks as parse_npy_header but none of the data size, which the
// caller compares with what it knows (the zip directory's size of the member).
NpyHeader parse_npy_header_prefix(const uint8_t* data, size_t size, const std::string& name);

// Bytes from the start of the file to the data (magic, version, length field and dict), read
// from the first 12 bytes (10 for version 1.0). Checks the magic, the version and the 1 MiB
// bound on the dict, so a reader knows how much to read before parse_npy_header_prefix.
uint64_t npy_header_length(const uint8_t* data, size_t size, const std::string& name);

// Reads .npy bytes in memory. The result views `data` (kept alive by `owner`) when it is
// little-endian; big-endian data is copied and converted.
Array parse_npy(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner);

// Maps and reads `path` (D13: no copy for little-endian files).
Array read_npy(const std::string& path);

// The .npy bytes of `array` (version 1.0, or 2.0 when the header needs it; C order,
// little-endian, NumPy's 64-byte header alignment). bfloat16 and float8 have no NumPy dtype:
// bad_input.
std::string npy_header(const Array& array, const std::string& what);
std::string npy_bytes(const Array& array, const std::string& what);
void write_npy(const std::string& path, const Array& array);

// The NumPy descr of a dtype ("<f4", "|u1", "|b1", "<c8").
std::string npy_descr(DType t, const std::string& what);

}  // namespace crucible::io
