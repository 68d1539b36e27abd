// Shards behind URLs as a SampleSource (issue 37): WebDataset tar shards
// ("s3://bucket/train-{000000..000127}.tar", "https://host/shards/a.tar,https://host/b.tar")
// and crucible's packed shards ("…/index.crpk", or a URL ending in '/' holding one). Each shard
// is fetched whole into the node's shard cache (shard_cache.h) by parallel range requests,
// checked, then mapped: a sample is a view into it, as with local shards.
//
// Opening reads the index only: a packed set's index.crpk, or each tar shard's "<shard>.idx"
// sidecar (written beside local shards when they are opened: upload it with the shard). A tar
// shard without a sidecar is downloaded at open to be indexed, and the log says how many were.
// Every download is checked before use: its size (the index's, else the server's), and the
// SHA-256 the index records, else the MD5 of S3's ETag; the log names, once at open, each shard
// that has neither and is checked by size only.
//
// I/O threads apart from the loader's decode threads fetch the shards of the planned order
// (SampleSource::plan) ahead, pinning at most `ahead_shards` of them; a decode thread waits only
// for a shard not yet fetched. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "crucible/data/remote/remote.h"
#include "crucible/data/formats/sample_source.h"

namespace crucible::data {

struct RemoteSourceOptions {
  RemoteOptions remote;
  std::string cache_dir;        // data.cache_dir
  int64_t cache_bytes = 0;      // data.cache_bytes
  int io_threads = 4;           // data.io_threads: shards fetched at once
  int ahead_shards = 0;         // shards pinned ahead of the reader; 0: io_threads + 1
  int least_ahead_shards = 0;   // the fewest that reading works with; 0: ahead_shards
  std::string ahead_why;        // what ahead_shards covers, for the log
  BoxPolicy boxes;              // a packed detection set's targets: data.bad_boxes, data.max_boxes
};

// Reading ahead within the cache: `ahead_shards` when data.cache_bytes holds that many of the
// largest shard, else as many as it holds (a warning says what waits for downloads then), and
// bad_input below `least_ahead_shards`. Never more than the shards there are.
int shards_read_ahead(const RemoteSourceOptions& options, int64_t shards, uint64_t largest_shard_bytes);

// bad_input when the path is neither form, when the cache cannot hold `least_ahead_shards` of
// the largest shard, and for each refusal of remote.h.
std::unique_ptr<SampleSource> open_remote_samples(const std::string& path, const RemoteSourceOptions& options);

}  // namespace crucible::data
