// One entry point for every array file crucible reads and writes: the format is detected from
// the content, never the extension (D12), and a set of named arrays comes back with what the
// reader skipped or adjusted. Used by `crucible inspect` (headers only where the data is
// compressed) and `crucible convert` (streaming where the formats allow). Torch-free.
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
  // Non-empty: only the array of this name (convert --name); bad_input listing the names when
  // there is none. An npz member not chosen is never inflated.
  std::string name;
  // Bytes one read may inflate from compressed data (npz members, gzip IDX), taken member by
  // member from the declared sizes before anything is allocated (issue 10; --memory-budget-mb).
  // 0: default_memory_budget(), half the physical memory.
  uint64_t memory_budget = 0;
};

// Reads any supported file. Single-array formats name their array after the file's stem.
// Throws bad_input (exit 2) for anything malformed, naming file, offset and expectation; for
// an undetectable file without `raw`, says how to read it as raw (D12); for compressed data
// over `options.memory_budget`, names the member, its sizes and the budget.
TensorSet read_tensors(const std::string& path, const ReadOptions& options = {});

// One array without its data: what `crucible inspect` shows.
struct ArrayInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::string shape_string() const;  // "[3, 4]", "[]" for 0-d
};

struct TensorSetInfo {
  Format format = Format::kUnknown;
  std::vector<ArrayInfo> arrays;
  std::map<std::string, std::string> metadata;  // as TensorSet
  std::vector<std::string> skipped;
  std::vector<std::string> notes;
};

// What read_tensors would return, without the data. Compressed data is not inflated (npz: each
// member's .npy header, at most 1 MiB; gzip IDX: its 4 + 4·ndim header bytes), so time and
// memory do not grow with what members inflate to and no budget applies; other formats are
// read as read_tensors reads them (mapped, data untouched; text parsed). The same errors for
// malformed headers, plus an npz member whose header disagrees with the zip directory's size;
// a deflate stream corrupt after the header goes unnoticed (read_tensors reports it).
TensorSetInfo inspect_tensors(const std::string& path, const ReadOptions& options = {});

// The description of arrays already read.
TensorSetInfo describe_tensors(const TensorSet& set);

struct WriteOptions {
  bool compress = false;  // npz: deflate members (np.savez_compressed)
  TextOptions text;
};

// Writes arrays in `format`, atomically. Single-array formats (npy, raw, text) need exactly
// one array.
void write_tensors(const std::string& path, Format format, const TensorSet& set, const WriteOptions& options = {});

// `crucible convert`: writes to `output` in `format` exactly the bytes that
// write_tensors(output, format, read_tensors(input, read), write) writes, but an npz member
// going to npy or raw output (little-endian, C order) is inflated in 1 MiB chunks straight into
// the output file, so memory stays small whatever it inflates to. The memory budget bounds
// what is inflated either way, checked before the output is created. Atomic: after an error
// nothing is left at `output`. Returns what was converted (`read.name` applied).
TensorSetInfo convert_tensors(const std::string& input, const std::string& output, Format format,
                              const ReadOptions& read = {}, const WriteOptions& write = {});

struct ArrayStats {
  double min = 0, max = 0, mean = 0;
  int64_t nan = 0, inf = 0, count = 0;
};
// Statistics over the finite values (min/max/mean) plus NaN/Inf counts; bad_input for complex.
ArrayStats array_stats(const Array& array, const std::string& what);

}  // namespace crucible::io
