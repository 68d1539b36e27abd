// One entry point for every array file crucible reads and writes: the format is detected from
// the content, never the extension (D12), and a set of named arrays comes back with what the
// reader skipped or adjusted. Used by `crucible inspect` and `crucible convert`. Torch-free.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crucible/io/array.h"
#include "crucible/io/raw.h"
#include "crucible/io/text.h"

namespace crucible::io {

enum class Format { kNpy, kNpz, kSafetensors, kPt, kIdx, kText, kRaw, kUnknown };

const char* format_name(Format f);  // "npy", "npz", "safetensors", "pt", "idx", "text", "raw"

// What the bytes are. `gzip` is set for a gzip-compressed IDX file. Text means printable
// characters that look like numbers; raw is never detected (it has no header), kUnknown is
// returned instead.
Format detect_format(const uint8_t* data, size_t size, bool* gzip = nullptr);
Format detect_file_format(const std::string& path, bool* gzip = nullptr);

// The output format for a file name's extension (.npy .npz .safetensors .bin/.raw .txt/.csv);
// bad_input listing the choices otherwise.
Format format_for_extension(const std::string& path);

struct TensorSet {
  Format format = Format::kUnknown;
  std::vector<NamedArray> arrays;
  std::map<std::string, std::string> metadata;  // safetensors __metadata__
  std::vector<std::string> skipped;             // non-array content, one line each
  std::vector<std::string> notes;               // adjustments made while reading
};

struct ReadOptions {
  std::optional<RawSpec> raw;  // --dtype/--shape: the file is raw (refused if it has a header)
  TextOptions text;
};

// Reads any supported file. Single-array formats name their array after the file's stem.
// Throws bad_input (exit 2) for anything malformed, naming file, offset and expectation; for
// an undetectable file without `raw`, says how to read it as raw (D12).
TensorSet read_tensors(const std::string& path, const ReadOptions& options = {});

struct WriteOptions {
  bool compress = false;  // npz: deflate members (np.savez_compressed)
  TextOptions text;
};

// Writes arrays in `format`, atomically. Single-array formats (npy, raw, text) need exactly
// one array.
void write_tensors(const std::string& path, Format format, const TensorSet& set, const WriteOptions& options = {});

struct ArrayStats {
  double min = 0, max = 0, mean = 0;
  int64_t nan = 0, inf = 0, count = 0;
};
// Statistics over the finite values (min/max/mean) plus NaN/Inf counts; bad_input for complex.
ArrayStats array_stats(const Array& array, const std::string& what);

}  // namespace crucible::io
