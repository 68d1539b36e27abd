// NumPy .npz archives (np.savez: stored members; np.savez_compressed: deflated) through
// libzip. Members are addressed by name ("x" for member "x.npy"). Decompressed sizes are
// checked against what deflate can produce from the member's compressed bytes before anything
// is allocated (zip bombs are refused). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/io/array.h"

namespace crucible::io {

// Every .npy member, in archive order; `skipped` gets the names of other members.
std::vector<NamedArray> parse_npz(const uint8_t* data, size_t size, const std::string& name,
                                  std::vector<std::string>* skipped = nullptr);
std::vector<NamedArray> read_npz(const std::string& path, std::vector<std::string>* skipped = nullptr);

// Writes arrays as members "<name>.npy", deflated when `compress` (np.savez_compressed),
// atomically (law 5).
void write_npz(const std::string& path, const std::vector<NamedArray>& arrays, bool compress);

}  // namespace crucible::io
