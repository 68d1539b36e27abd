// Archives that inflate to far more than they are (issue 10): deflate streams of zeros built
// from one compressed MiB repeated, so a 2 GiB member costs a KiB of work and memory; zip
// archives of such members (optionally with a lying directory size); npz and gzip IDX files.
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/io/dtype.h"

namespace crucible::test {

struct Deflated {
  std::string bytes;  // a raw deflate stream
  uint32_t crc = 0;   // of the uncompressed bytes
  uint64_t size = 0;  // uncompressed bytes
};

// `head` then `zeros` zero bytes as one raw deflate stream.
Deflated deflate_zeros(const std::string& head, uint64_t zeros);

struct ZipEntry {
  std::string name;
  Deflated data;
  uint64_t declared_size = 0;  // the zip directory's uncompressed size; 0: the true size
};

// Appends `v` as `bytes` little-endian bytes.
void put(std::string& s, uint64_t v, int bytes);

// A zip archive (no zip64: members under 4 GiB) of deflated members.
void write_zip(const std::string& path, const std::vector<ZipEntry>& entries);

// The .npy header crucible and NumPy write for a C-order little-endian array.
std::string header_for(io::DType t, std::vector<int64_t> shape);

// An .npz of one deflated member "<name>.npy": an npy header for [n] elements of `t`, then zeros.
void zeros_npz(const std::string& path, const std::string& name, io::DType t, uint64_t n);

// A gzip IDX file: u8 [d0, d1, d2] of zeros.
void zeros_gzip_idx(const std::string& path, uint32_t d0, uint32_t d1, uint32_t d2);

}  // namespace crucible::test
