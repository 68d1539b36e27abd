// `crucible pack`: copies any SampleSource into crucible's packed shards — page-aligned,
// memory-mappable shard files plus one index — keeping the original encoded bytes, re-encoding
// JPEGs no larger than a maximum side, or storing raw RGB pixels; optionally validating every
// sample by decoding it (D5, D11). Written atomically (law 5). Torch-free.
//
// Layout of <dst>/: index.crpk = magic "CRPKIDX1", u64 LE JSON length, JSON {"version": 1,
// "classes": [...], "samples": N, "shards": [...file names...], "align": A, "mode": "..."},
// then N records of {u32 shard, u32 size, u64 offset, i64 label} (24 bytes, LE); shard files
// shard-00000.bin … hold the sample bytes, each starting at a multiple of A (default 4096).
// Sample names in reports are "<dst>/<shard>#<index>". A detection source (has_boxes) is packed as
// index version 2 (pack_format.h): each image's boxes as its JSON target (json_target.h) right
// after its bytes, the image's size in its record, the category ids, the source's box counts and
// its EXIF choice in the header; re-encoding scales the boxes with the image, and validation
// checks each decoded size against the size its annotations give (D17).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/data/formats/sample_source.h"

namespace crucible::data {

struct PackOptions {
  enum class Mode { kOriginal, kReencode, kRaw };
  Mode mode = Mode::kOriginal;
  int max_side = 0;       // kReencode: longest side after resizing (0 = keep size); kRaw too
  int quality = 90;       // kReencode JPEG quality
  bool validate = false;  // decode every sample; bad ones are reported and left out
  int64_t shard_bytes = int64_t{1} << 30;
  int64_t align = 4096;   // sample start alignment (power of two, >= 64)
  int threads = 1;        // decoding/re-encoding threads (output order is the source order)
};

struct PackReport {
  int64_t samples = 0;                // written
  int64_t bytes = 0;                  // sample bytes written (without padding)
  std::vector<std::string> bad;       // "name: reason", for samples left out (validate/re-encode)
  std::vector<std::string> files;     // paths written
};

PackReport pack_samples(const SampleSource& source, const std::string& dst, const PackOptions& options);

// `crucible pack --lmdb` (and tests): writes `source` as an LMDB environment in the folder
// `path` (created if missing): keys are the zero-padded sample index (so key order is source
// order), values u32 LE label (0xffffffff for -1) + the encoded bytes, plus "__classes__" = a
// JSON list of class names. data.mdb is written to a temporary and committed (law 5).
void write_lmdb(const SampleSource& source, const std::string& path);

}  // namespace crucible::data
