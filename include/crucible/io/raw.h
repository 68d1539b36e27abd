// Raw binary files as ndarray.tofile() writes them: bytes and nothing else, so the dtype and
// shape must be declared (D12). The file size must match; one dimension may be -1 and is then
// computed. Examples: KITTI velodyne scans are float32 with shape -1,4 (x, y, z, reflectance
// per point); SemanticKITTI .label files are uint32 with shape -1. Little-endian, C order.
// The Array views the memory-mapped file (D13). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/io/array.h"

namespace crucible::io {

struct RawSpec {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // at most one -1
};

// Parses "-1,4" / "[3, 224, 224]" / "" (→ [-1]) into a shape; bad_input naming `what`.
std::vector<int64_t> parse_shape(const std::string& text, const std::string& what);

// Maps `path` as raw elements of `spec`; bad_input giving expected and actual bytes when the
// size does not match.
Array read_raw(const std::string& path, const RawSpec& spec);
// The shape with -1 resolved for a file of `size` bytes (exposed for tests and messages).
std::vector<int64_t> resolve_raw_shape(uint64_t size, const RawSpec& spec, const std::string& name);

// Writes the elements in C order (tofile), atomically.
void write_raw(const std::string& path, const Array& array);

}  // namespace crucible::io
