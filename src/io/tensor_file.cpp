// Format detection and the read/write dispatch for every array format; header-only inspection
// and streaming conversion of compressed members (issue 10).
#include "crucible/io/tensor_file.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
#include "crucible/core/mmap.h"
#include "crucible/io/idx.h"
#include "crucible/io/npy.h"
#include "crucible/io/npz.h"
#include "crucible/io/pt.h"
#include "crucible/io/safetensors.h"

namespace crucible::io {
namespace {

namespace fs = std::filesystem;

bool zip_has_member_suffix(const uint8_t* data, size_t size, const char* suffix) {
  // Local file headers ("PK\3\4") carry the member name at offset 30; a scan of the names is
  // enough to tell a torch.save archive (…/data.pkl) from an npz.
  const size_t n = std::strlen(suffix);
  for (size_t i = 0; i + 30 <= size; ++i) {
    if (data[i] != 'P' || data[i + 1] != 'K' || data[i + 2] != 3 || data[i + 3] != 4) continue;
    const size_t len = data[i + 26] | (data[i + 27] << 8);
    if (i + 30 + len > size) break;
    const char* name = reinterpret_cast<const char*>(data + i + 30);
    if (len >= n && std::memcmp(name + len - n, suffix, n) == 0) return true;
  }
  return false;
}

bool looks_like_idx(const uint8_t* d, size_t size) {
  if (size < 8 || d[0] != 0 || d[1] != 0 || d[3] == 0) return false;
  static const uint8_t kCodes[] = {0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E};
  size_t item = 0;
  static const size_t kSizes[] = {1, 1, 2, 4, 4, 8};
  for (size_t i = 0; i < 6; ++i) {
    if (d[2] == kCodes[i]) item = kSizes[i];
  }
  if (item == 0) return false;
  const size_t header = 4 + 4 * static_cast<size_t>(d[3]);
  if (size < header) return false;
  unsigned __int128 n = item;
  for (size_t i = 0; i < d[3]; ++i) {
    const uint8_t* p = d + 4 + 4 * i;
    n *= load_be32(p);  // IDX dimensions are big-endian
    if (n > size) return false;
  }
  return header + static_cast<size_t>(n) == size;
}

bool looks_like_text(const uint8_t* d, size_t size) {
  const size_t n = std::min<size_t>(size, 4096);
  bool digit = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = d[i];
    if (c == '\n' || c == '\r' || c == '\t') continue;
    if (c < 0x20 || c > 0x7e) return false;
    digit |= c >= '0' && c <= '9';
  }
  return digit;
}

std::string stem(const std::string& path) { return fs::path(path).stem().string(); }

Array from_idx(IdxArray idx) {
  return Array::owned(idx.dtype, std::move(idx.shape), std::move(idx.data));
}

[[noreturn]] void not_one_array(const std::vector<std::string>& names, const std::string& path, Format format) {
  throw bad_input("{}: a {} file holds one array, the input has {} ({}); pick one with --name or write npz or "
                  "safetensors",
                  path, format_name(format), names.size(), fmt::join(names, ", "));
}

const Array& single(const TensorSet& set, const std::string& path, Format format) {
  if (set.arrays.size() != 1) {
    std::vector<std::string> names;
    for (const auto& a : set.arrays) names.push_back(a.name);
    not_one_array(names, path, format);
  }
  return set.arrays[0].array;
}

// The positions in `names` of `only`, or all of them when `only` is empty; bad_input listing
// the names when there is none of that name.
std::vector<size_t> chosen(const std::vector<std::string>& names, const std::string& only, const std::string& path) {
  std::vector<size_t> out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (only.empty() || names[i] == only) out.push_back(i);
  }
  if (!only.empty() && out.empty()) {
    throw bad_input("{}: no array named '{}' (it has: {})", path, only, fmt::join(names, ", "));
  }
  return out;
}

// Keeps the elements (NamedArray, ArrayInfo) named `only`, all when it is empty.
template <typename T>
void keep_named(std::vector<T>& items, const std::string& only, const std::string& path) {
  if (only.empty()) return;
  std::vector<std::string> names;
  for (const auto& i : items) names.push_back(i.name);
  std::vector<T> kept;
  for (size_t i : chosen(names, only, path)) kept.push_back(std::move(items[i]));
  items = std::move(kept);
}

std::vector<std::string> member_names(const NpzArchive& zip) {
  std::vector<std::string> names;
  for (const auto& m : zip.members()) names.push_back(m.name);
  return names;
}

std::vector<std::string> npz_skipped(const NpzArchive& zip) {
  std::vector<std::string> out;
  for (const auto& s : zip.skipped()) out.push_back(s + ": not an .npy member");
  return out;
}

ArrayInfo member_info(const NpzMember& m) {
  return ArrayInfo{m.name, m.header.dtype, m.header.shape, m.size - m.header.data_offset};
}

// The npy header crucible writes for the member's dtype and shape (data is not touched).
std::string canonical_npy_header(const NpzMember& m, const std::string& what) {
  Array a;
  a.dtype = m.header.dtype;
  a.shape = m.header.shape;
  a.strides = Array::c_strides(a.shape);
  return npy_header(a, what);
}

}  // namespace

const char* format_name(Format f) {
  switch (f) {
    case Format::kNpy:
      return "npy";
    case Format::kNpz:
      return "npz";
    case Format::kSafetensors:
      return "safetensors";
    case Format::kPt:
      return "pt";
    case Format::kIdx:
      return "idx";
    case Format::kText:
      return "text";
    case Format::kRaw:
      return "raw";
    case Format::kUnknown:
      return "unknown";
  }
  return "?";
}

Format detect_format(const uint8_t* d, size_t size, bool* gzip) {
  if (gzip != nullptr) *gzip = false;
  if (size >= 6 && std::memcmp(d, "\x93NUMPY", 6) == 0) return Format::kNpy;
  if (size >= 4 && d[0] == 'P' && d[1] == 'K' && ((d[2] == 3 && d[3] == 4) || (d[2] == 5 && d[3] == 6))) {
    return zip_has_member_suffix(d, size, "/data.pkl") ? Format::kPt : Format::kNpz;
  }
  if (is_gzip(d, size)) {
    if (gzip != nullptr) *gzip = true;
    return Format::kIdx;  // the only gzip format crucible reads; parse_idx checks the contents
  }
  if (looks_like_idx(d, size)) return Format::kIdx;
  if (size >= 10) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | d[i];
    if (n >= 2 && 8 + n <= size && d[8] == '{') return Format::kSafetensors;
  }
  if (size >= 2 && d[0] == 0x80 && d[1] >= 2 && d[1] <= 5) return Format::kPt;  // a legacy torch.save pickle
  if (looks_like_text(d, size)) return Format::kText;
  return Format::kUnknown;
}

Format detect_file_format(const std::string& path, bool* gzip) {
  auto file = MappedFile::open(path);
  return detect_format(file->data(), file->size(), gzip);
}

Format format_for_extension(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".npy") return Format::kNpy;
  if (ext == ".npz") return Format::kNpz;
  if (ext == ".safetensors") return Format::kSafetensors;
  if (ext == ".bin" || ext == ".raw" || ext == ".label") return Format::kRaw;
  if (ext == ".txt" || ext == ".csv" || ext == ".tsv") return Format::kText;
  throw bad_input("{}: cannot tell the output format from '{}': use .npy, .npz, .safetensors, .bin/.raw or .txt/.csv",
                  path, ext.empty() ? "(no extension)" : ext);
}

TensorSet read_tensors(const std::string& path, const ReadOptions& options) {
  auto file = MappedFile::open(path);
  TensorSet set;
  const Format detected = detect_format(file->data(), file->size());
  if (options.raw) {
    if (detected != Format::kUnknown && detected != Format::kText) {
      throw bad_input("{} is a {} file, which states its own dtype and shape; --dtype/--shape are for raw files (D12)",
                      path, format_name(detected));
    }
    set.format = Format::kRaw;
    Array a;
    a.dtype = options.raw->dtype;
    a.shape = resolve_raw_shape(file->size(), *options.raw, path);
    a.strides = Array::c_strides(a.shape);
    a.data = file->data();
    a.owner = file;
    set.arrays.push_back({stem(path), std::move(a)});
    keep_named(set.arrays, options.name, path);
    return set;
  }
  set.format = detected;
  switch (detected) {
    case Format::kNpy:
      set.arrays.push_back({stem(path), parse_npy(file->data(), file->size(), path, file)});
      break;
    case Format::kNpz: {
      // Only the chosen members are inflated (each under the one budget).
      NpzArchive zip(file->data(), file->size(), path);
      MemoryBudget budget(options.memory_budget);
      for (size_t i : chosen(member_names(zip), options.name, path)) {
        const NpzMember& m = zip.members()[i];
        set.arrays.push_back({m.name, zip.read(m, budget)});
      }
      set.skipped = npz_skipped(zip);
      break;
    }
    case Format::kSafetensors: {
      auto st = SafetensorsFile::parse(file->data(), file->size(), path, file);
      for (const auto& e : st.entries()) set.arrays.push_back({e.name, st.array(e)});
      set.metadata = st.metadata();
      break;
    }
    case Format::kPt: {
      PtContents pt = parse_pt(file->data(), file->size(), path, file);
      set.arrays = std::move(pt.tensors);
      set.skipped = std::move(pt.skipped);
      set.notes = std::move(pt.notes);
      break;
    }
    case Format::kIdx:
      set.arrays.push_back({stem(path), from_idx(parse_idx(file->data(), file->size(), path, options.memory_budget))});
      break;
    case Format::kText:
      set.arrays.push_back(
          {stem(path), parse_text(reinterpret_cast<const char*>(file->data()), file->size(), path, options.text)});
      break;
    case Format::kRaw:
    case Format::kUnknown:
      throw bad_input("{}: cannot tell the format: no npy, npz, safetensors, torch.save, IDX or text signature in its "
                      "first bytes. If it is raw data (ndarray.tofile, a .bin), give its --dtype and --shape, e.g. "
                      "--dtype float32 --shape -1,4 (D12)",
                      path);
  }
  keep_named(set.arrays, options.name, path);
  return set;
}

std::string ArrayInfo::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

TensorSetInfo describe_tensors(const TensorSet& set) {
  TensorSetInfo info;
  info.format = set.format;
  for (const auto& na : set.arrays) {
    info.arrays.push_back(ArrayInfo{na.name, na.array.dtype, na.array.shape, na.array.nbytes()});
  }
  info.metadata = set.metadata;
  info.skipped = set.skipped;
  info.notes = set.notes;
  return info;
}

TensorSetInfo inspect_tensors(const std::string& path, const ReadOptions& options) {
  auto file = MappedFile::open(path);
  const Format detected = options.raw ? Format::kRaw : detect_format(file->data(), file->size());
  TensorSetInfo info;
  info.format = detected;
  if (detected == Format::kNpz) {  // issue 10: only the members' headers are inflated
    NpzArchive zip(file->data(), file->size(), path);
    for (size_t i : chosen(member_names(zip), options.name, path)) info.arrays.push_back(member_info(zip.members()[i]));
    info.skipped = npz_skipped(zip);
    return info;
  }
  if (detected == Format::kIdx) {  // a gzip file inflates its header only
    const IdxHeader h = parse_idx_header(file->data(), file->size(), path);
    info.arrays.push_back(ArrayInfo{stem(path), h.dtype, h.shape, h.data_bytes});
    keep_named(info.arrays, options.name, path);
    return info;
  }
  return describe_tensors(read_tensors(path, options));
}

void write_tensors(const std::string& path, Format format, const TensorSet& set, const WriteOptions& options) {
  switch (format) {
    case Format::kNpy:
      write_npy(path, single(set, path, format));
      return;
    case Format::kNpz:
      write_npz(path, set.arrays, options.compress);
      return;
    case Format::kSafetensors:
      write_safetensors(path, set.arrays, set.metadata);
      return;
    case Format::kRaw:
      write_raw(path, single(set, path, format));
      return;
    case Format::kText:
      write_text(path, single(set, path, format), options.text);
      return;
    case Format::kIdx:
    case Format::kPt:
    case Format::kUnknown:
      break;
  }
  throw bad_input("{}: crucible does not write {} files", path, format_name(format));
}

TensorSetInfo convert_tensors(const std::string& input, const std::string& output, Format format,
                              const ReadOptions& read, const WriteOptions& write) {
  if (!read.raw) {
    auto file = MappedFile::open(input);
    if (detect_format(file->data(), file->size()) == Format::kNpz) {
      NpzArchive zip(file->data(), file->size(), input);
      const std::vector<std::string> names = member_names(zip);
      const std::vector<size_t> picks = chosen(names, read.name, input);
      const bool one_array_out = format == Format::kNpy || format == Format::kRaw || format == Format::kText;
      if (one_array_out && picks.size() != 1) {  // said before anything is inflated
        std::vector<std::string> picked;
        for (size_t i : picks) picked.push_back(names[i]);
        not_one_array(picked, output, format);
      }
      const NpzMember* m = picks.size() == 1 ? &zip.members()[picks[0]] : nullptr;
      // The member's data bytes are the array's C-order little-endian bytes: copy them through.
      if ((format == Format::kNpy || format == Format::kRaw) && !m->header.big_endian && !m->header.fortran_order) {
        MemoryBudget budget(read.memory_budget);
        budget.take(m->size, m->compressed_size, zip.where(*m));  // before the output exists
        AtomicFile f(output);
        if (format == Format::kNpy) f.write(canonical_npy_header(*m, output));
        zip.stream_data(*m, [&](const uint8_t* p, size_t n) { f.write(p, n); });
        f.commit();
        TensorSetInfo info;
        info.format = Format::kNpz;
        info.arrays.push_back(member_info(*m));
        info.skipped = npz_skipped(zip);
        return info;
      }
    }
  }
  const TensorSet set = read_tensors(input, read);
  write_tensors(output, format, set, write);
  return describe_tensors(set);
}

ArrayStats array_stats(const Array& array, const std::string& what) {
  ArrayStats s;
  double sum = 0;
  int64_t finite = 0;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -std::numeric_limits<double>::infinity();
  for_each_double(array, what, [&](int64_t, double v) {
    ++s.count;
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      ++finite;
      sum += v;
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
    }
  });
  if (finite == 0) {
    s.min = s.max = std::numeric_limits<double>::quiet_NaN();
  }
  s.mean = finite > 0 ? sum / static_cast<double>(finite) : std::numeric_limits<double>::quiet_NaN();
  return s;
}

}  // namespace crucible::io
