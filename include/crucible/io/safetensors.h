// safetensors files: u64 LE header length N, N bytes of JSON ({name: {dtype, shape,
// data_offsets}}, optional "__metadata__" str→str), then the byte buffer. Readable by the
// Python `safetensors` package and by `crucible inspect`. The reader checks every offset and
// size against the file before trusting it. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crucible/io/array.h"
#include "crucible/io/dtype.h"

namespace crucible::io {

// A tensor to write: bytes are C-order, little-endian, `nbytes` = prod(shape) * dtype_size.
struct TensorBytes {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// Writes tensors (in the given order) and metadata to `path` atomically (law 5).
void write_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Arrays (any layout) by name; complex dtypes have no safetensors type (bad_input).
void write_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                       const std::map<std::string, std::string>& metadata);

// A safetensors file mapped into memory (D13) and validated.
class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t offset;  // into the byte buffer
    uint64_t nbytes;
  };

  // Reads and validates `path`; throws bad_input naming the file, the byte offset or tensor,
  // and what was expected (truncated file, header past the end, gaps, overlaps, bad dtype).
  static SafetensorsFile read(const std::string& path);
  // The same over bytes in memory kept alive by `owner` (for fuzzing and zip members).
  static SafetensorsFile parse(const uint8_t* data, size_t size, const std::string& name,
                               std::shared_ptr<const void> owner);

  const std::vector<Entry>& entries() const { return entries_; }  // sorted by offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const Entry* find(const std::string& name) const;
  const uint8_t* data(const Entry& e) const { return data_ + buffer_start_ + e.offset; }
  // An entry as an Array viewing the file's bytes.
  Array array(const Entry& e) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;  // the whole file
  std::shared_ptr<const void> owner_;
  uint64_t buffer_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace crucible::io
