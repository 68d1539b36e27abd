// Fixed-width integers in a stated byte order, read from and appended to byte buffers: the
// one place the file formats' headers (IDX is big-endian; packed shards, tar indexes, raw
// images and npz/zip are little-endian) get their integers. Portable shifts, no alignment
// assumption. Torch-free, header-only.
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

inline uint16_t load_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline uint64_t load_le64(const uint8_t* p) { return uint64_t{load_le32(p)} | uint64_t{load_le32(p + 4)} << 32; }
inline uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

inline void append_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void append_le64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace crucible
