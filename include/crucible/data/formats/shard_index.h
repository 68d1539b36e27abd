// The indexes of the two shard formats, apart from where a shard's bytes come from (a local
// file, or an object fetched into the shard cache, remote_source.cpp): a WebDataset tar shard's
// samples (offset, size, label, key of each image member) and its "<shard>.idx" sidecar, and a
// packed set's index.crpk (pack_format.h). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/formats/pack_format.h"

namespace crucible::data {

struct TarMember {
  uint64_t offset = 0;  // of the image member's bytes in the shard
  uint64_t size = 0;
  int64_t label = -1;
  std::string key;
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
// with an empty `sha256` writes that old format.
bool decode_tar_sidecar(const std::string& raw, TarShardIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                        std::string* sha256 = nullptr);
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
};
PackedIndex parse_packed_index(const std::string& raw, const std::string& name);

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
