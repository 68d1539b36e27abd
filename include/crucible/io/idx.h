// IDX files (MNIST, Fashion-MNIST): magic 00 00 <type> <ndim>, ndim big-endian u32 dims,
// then big-endian C-order data. Read gzip-compressed or plain (detected from the bytes, not
// the name). Every size is checked against the header, and a gzip file's against the memory
// budget, before anything is allocated. Torch-free.
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

// What the header says, without the data.
struct IdxHeader {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t header_bytes = 0;  // 4 + 4 * ndim
  uint64_t data_bytes = 0;    // prod(shape) * dtype_size
  bool gzip = false;
};

// Reads `path`. Throws bad_input naming the file, the byte offset and what was expected for a
// wrong magic, an unknown type, a truncated file or bytes after the declared data. A gzip file
// inflates under a MemoryBudget of `memory_budget` bytes (0: default_memory_budget()), checked
// against the size its header declares before anything is allocated.
IdxArray read_idx(const std::string& path, uint64_t memory_budget = 0);
// The same over bytes in memory (for fuzzing); `name` names them in messages.
IdxArray parse_idx(const uint8_t* data, size_t size, const std::string& name, uint64_t memory_budget = 0);
// The header alone: a gzip file inflates only its first 4 + 4·ndim bytes (issue 10), so this
// costs the same whatever the data inflates to. Checks a plain file's size against the header
// and a gzip file's claim against what deflate can produce from its size; reads no data.
IdxHeader parse_idx_header(const uint8_t* data, size_t size, const std::string& name);
bool is_gzip(const uint8_t* data, size_t size);

// Writes `array` to `path` atomically, gzip-compressed when `gzip` (for tests and tools).
void write_idx(const std::string& path, const IdxArray& array, bool gzip);

}  // namespace crucible::io
