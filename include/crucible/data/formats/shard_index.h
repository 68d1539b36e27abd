// The indexes of the two shard formats, apart from where a shard's bytes come from (a local
// file, or an object fetched into the shard cache, remote_source.cpp): a WebDataset tar shard's
// samples (offset, size, label, key of each image member) and its "<shard>.idx" sidecar, and a
// packed set's index.crpk (pack_format.h). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/formats/pack_format.h"
#include "crucible/data/formats/sample_source.h"

namespace crucible::data {

struct TarMember {
  uint64_t offset = 0;  // of the image member's bytes in the shard
  uint64_t size = 0;
  int64_t label = -1;
  std::string key;
  // A detection sample's "json" member holding a target (json_target.h); size 0: none.
  uint64_t target_offset = 0, target_size = 0;
};

struct TarShardIndex {
  std::vector<TarMember> samples;
  uint64_t skipped = 0;  // groups without an image member
};

// Walks the 512-byte headers of a tar shard held in memory (`size` bytes) with bounds checks
// and groups members into WebDataset samples. bad_input naming `shard` for a damaged archive.
TarShardIndex index_tar_bytes(const uint8_t* data, uint64_t size, const std::string& shard);

// "<shard>.idx" (written beside local shards when they are opened): the index and the size,
// mtime and SHA-256 (hex) of the shard it describes; false when `raw` is damaged or not such a
// file. A sidecar written before the hash was recorded still reads, with `sha256` empty; encoding
// with an empty `sha256` writes that old format. Since issue 47 the sidecar also records where each
// sample's JSON target is (CRTARIX3); the older ones read with none.
bool decode_tar_sidecar(const std::string& raw, TarShardIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                        std::string* sha256 = nullptr, bool* has_targets = nullptr);
std::string encode_tar_sidecar(const TarShardIndex& index, uint64_t shard_size, int64_t mtime_ns,
                               const std::string& sha256);

// index.crpk, parsed and checked against itself (records name listed shards, labels >= -1,
// offsets aligned); `name` is what messages call it. Checking records against the shards'
// sizes is the opener's business (the shards may not be here yet).
struct PackedIndex {
  std::vector<std::string> classes;
  std::vector<std::string> shards;        // file names beside the index
  std::vector<uint64_t> shard_bytes;      // each shard's size (empty: an index written before they were recorded)
  std::vector<std::string> shard_sha256;  // each shard's SHA-256, hex (empty: likewise)
  int64_t align = 1;
  std::string mode;
  std::vector<pack_format::Record> records;
  // A detection set (version 2): each record's JSON target follows its image; labels' ids in the
  // packed source (COCO's category ids; empty when the labels are the ids); what the source's
  // bad-box policy did when it was packed.
  bool boxes = false;
  std::vector<int64_t> category_ids;
  BoxCounts box_counts;
  bool exif_orientation = true;  // whether the boxes are in the EXIF-oriented frame of the stored bytes
};
PackedIndex parse_packed_index(const std::string& raw, const std::string& name);

// A packed detection sample's target: the record's target_size bytes at `target` (right after
// the image), parsed (json_target.h) and checked against the record's image size under `policy`;
// sets `sample`'s boxes, image id and size. bad_input naming `where`.
void attach_packed_target(EncodedSample* sample, const pack_format::Record& record, const uint8_t* target,
                          const std::string& where, const BoxPolicy& policy, int64_t classes);

// Samples per shard (SampleSource::shard_counts) of records that carry their shard number
// (`.shard`), when each shard's records are contiguous and in shard order, as the writers make
// them; empty otherwise.
template <typename Records>
std::vector<int64_t> contiguous_shard_counts(const Records& records, size_t shards) {
  std::vector<int64_t> out(shards, 0);
  uint32_t last = 0;
  for (const auto& r : records) {
    if (r.shard < last) return {};
    last = r.shard;
    ++out[r.shard];
  }
  return out;
}

}  // namespace crucible::data
