// IDX files (MNIST, Fashion-MNIST): magic 00 00 <type> <ndim>, ndim big-endian u32 dims,
// then big-endian C-order data. Read gzip-compressed or plain (detected from the bytes, not
// the name). Every size is checked against the header before anything is allocated.
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/io/dtype.h"

namespace crucible::io {

struct IdxArray {
  DType dtype = DType::kU8;     // one of u8, i8, i16, i32, f32, f64
  std::vector<int64_t> shape;   // e.g. [60000, 28, 28]
  std::vector<uint8_t> data;    // native byte order, C order, prod(shape) * dtype_size bytes
};

// IDX type code → DType; throws bad_input naming `path` for an unknown code.
DType idx_dtype(uint8_t code, const std::string& path);
uint8_t idx_code(DType t);

// Reads `path`. Throws bad_input naming the file, the byte offset and what was expected for a
// wrong magic, an unknown type, a truncated file or bytes after the declared data.
IdxArray read_idx(const std::string& path);
// The same over bytes in memory (for fuzzing); `name` names them in messages.
IdxArray parse_idx(const uint8_t* data, size_t size, const std::string& name);
bool is_gzip(const uint8_t* data, size_t size);

// Writes `array` to `path` atomically, gzip-compressed when `gzip` (for tests and tools).
void write_idx(const std::string& path, const IdxArray& array, bool gzip);

}  // namespace crucible::io
