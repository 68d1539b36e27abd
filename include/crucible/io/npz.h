// NumPy .npz archives (np.savez: stored members; np.savez_compressed: deflated) through
// libzip. Members are addressed by name ("x" for member "x.npy"). Opening an archive reads the
// zip directory and each member's .npy header only; data is inflated on request, under a
// MemoryBudget (issue 10: a 2 MB archive can claim 2 GiB) or streamed in chunks. Declared sizes
// are checked against what deflate can produce before anything is allocated (zip bombs are
// refused). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crucible/io/array.h"
#include "crucible/io/npy.h"

struct zip;  // libzip's zip_t

namespace crucible {
class MemoryBudget;
}

namespace crucible::io {

// One .npy member as the zip directory and its own header describe it.
struct NpzMember {
  std::string name;              // "x" for member "x.npy"
  NpyHeader header;              // parsed from the member's first bytes only
  uint64_t size = 0;             // uncompressed bytes (zip directory) = header.data_offset + data bytes
  uint64_t compressed_size = 0;  // bytes in the archive
  uint64_t index = 0;            // zip entry
};

// An .npz in memory (`data` must outlive it). Opening reads every .npy member's header, at most
// 1 MiB each, and checks that its shape and dtype need exactly the bytes the zip directory
// declares; no data is inflated. Not thread-safe (libzip state).
class NpzArchive {
 public:
  // Throws bad_input naming `name` (and the member) for anything malformed.
  NpzArchive(const uint8_t* data, size_t size, std::string name);
  ~NpzArchive();
  NpzArchive(const NpzArchive&) = delete;
  NpzArchive& operator=(const NpzArchive&) = delete;

  const std::vector<NpzMember>& members() const { return members_; }    // archive order
  const std::vector<std::string>& skipped() const { return skipped_; }  // members that are not .npy
  std::string where(const NpzMember& m) const;                          // "file.npz:x.npy"

  // Takes the member's size from `budget` (bad_input when over it, before allocating), then
  // inflates it into memory. The Array owns its buffer.
  Array read(const NpzMember& m, MemoryBudget& budget);

  // Inflates the member's data (the bytes after its header) in chunks of at most 1 MiB, each
  // passed to `sink` in order; holds one chunk at a time. Checks the total against the zip
  // directory after the last chunk (bad_input then). Takes nothing from a budget: the caller
  // does, before it creates what the sink writes to.
  void stream_data(const NpzMember& m, const std::function<void(const uint8_t*, size_t)>& sink);

 private:
  std::string name_;
  zip* zip_ = nullptr;
  std::vector<NpzMember> members_;
  std::vector<std::string> skipped_;
};

// Every .npy member, in archive order; `skipped` gets the names of other members. The members
// inflate under one MemoryBudget of `memory_budget` bytes (0: default_memory_budget()).
std::vector<NamedArray> parse_npz(const uint8_t* data, size_t size, const std::string& name,
                                  std::vector<std::string>* skipped = nullptr, uint64_t memory_budget = 0);
std::vector<NamedArray> read_npz(const std::string& path, std::vector<std::string>* skipped = nullptr,
                                 uint64_t memory_budget = 0);

// Writes arrays as members "<name>.npy", deflated when `compress` (np.savez_compressed),
// atomically (law 5).
void write_npz(const std::string& path, const std::vector<NamedArray>& arrays, bool compress);

}  // namespace crucible::io
