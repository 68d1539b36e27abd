// The packed-shard index format, defined once for its writer (pack.cpp) and its reader
// (sample_source.cpp). index.crpk = magic "CRPKIDX1", u64 LE length of a JSON header
// {"version": 1, "classes": [...], "samples": N, "shards": [...], "align": A, "mode": "...",
// "shard_bytes": [...], "shard_sha256": [...]} (the last two since issue 37: what a reader that
// fetched a shard checks it against; older indexes lack them), then N records of 24 bytes,
// little-endian. A detection set (issue 47) is version 2: its header adds "target": "boxes",
// "category_ids" and "box_counts", and its records are 40 bytes, adding where the sample's JSON
// target (json_target.h) lies — right after the image's bytes in the same shard — and the
// image's size, which batches grouped by aspect ratio read without touching the shards.
// Torch-free, header-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "crucible/core/byte_order.h"

namespace crucible::data::pack_format {

constexpr char kMagic[8] = {'C', 'R', 'P', 'K', 'I', 'D', 'X', '1'};
constexpr size_t kHeaderPrefixBytes = 16;  // magic + u64 JSON length
constexpr int kVersion = 1;       // classification: 24-byte records
constexpr int kVersionBoxes = 2;  // detection: 40-byte records with the target's place

// Where one sample's bytes are: shard file, byte range, label (-1: none); a detection sample's
// JSON target follows its image at offset + size, target_size bytes, and its image is
// width × height pixels.
struct Record {
  uint32_t shard = 0;
  uint32_t size = 0;
  uint64_t offset = 0;
  int64_t label = -1;
  uint32_t target_size = 0;
  uint32_t width = 0, height = 0;
};
constexpr size_t kRecordBytes = 24;       // u32 shard, u32 size, u64 offset, i64 label
constexpr size_t kRecordBytesBoxes = 40;  // … then u32 target_size, u32 width, u32 height, u32 0

inline size_t record_bytes(bool boxes) { return boxes ? kRecordBytesBoxes : kRecordBytes; }

inline void append_record(std::string& out, const Record& r, bool boxes = false) {
  append_le32(out, r.shard);
  append_le32(out, r.size);
  append_le64(out, r.offset);
  append_le64(out, static_cast<uint64_t>(r.label));
  if (!boxes) return;
  append_le32(out, r.target_size);
  append_le32(out, r.width);
  append_le32(out, r.height);
  append_le32(out, 0);
}

inline Record load_record(const uint8_t* p, bool boxes = false) {
  Record r;
  r.shard = load_le32(p);
  r.size = load_le32(p + 4);
  r.offset = load_le64(p + 8);
  r.label = static_cast<int64_t>(load_le64(p + 16));
  if (boxes) {
    r.target_size = load_le32(p + 24);
    r.width = load_le32(p + 28);
    r.height = load_le32(p + 32);
  }
  return r;
}

// The index's first bytes: magic then the JSON header's length.
inline std::string header_prefix(uint64_t json_length) {
  std::string out(kMagic, sizeof kMagic);
  append_le64(out, json_length);
  return out;
}

inline bool has_magic(const uint8_t* p, size_t size) {
  return size >= sizeof kMagic && std::memcmp(p, kMagic, sizeof kMagic) == 0;
}

}  // namespace crucible::data::pack_format
