// Raw .bin files with a declared dtype and shape.
#include "crucible/io/raw.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"

namespace crucible::io {

std::vector<int64_t> parse_shape(const std::string& text, const std::string& what) {
  std::vector<int64_t> shape;
  std::string tok;
  auto flush = [&]() {
    if (tok.empty()) return;
    size_t pos = 0;
    int64_t v = 0;
    try {
      v = std::stoll(tok, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != tok.size() || v < -1) {
      throw bad_input("{}: '{}' is not a dimension (expected integers >= 0, or -1 once)", what, tok);
    }
    shape.push_back(v);
    tok.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == 'x' || c == '[' || c == ']' || c == '(' || c == ')') {
      flush();
    } else {
      tok += c;
    }
  }
  flush();
  if (shape.empty()) shape.push_back(-1);
  if (std::count(shape.begin(), shape.end(), -1) > 1) throw bad_input("{}: only one dimension may be -1", what);
  return shape;
}

std::vector<int64_t> resolve_raw_shape(uint64_t size, const RawSpec& spec, const std::string& name) {
  std::vector<int64_t> shape = spec.shape;
  int unknown = -1;
  std::vector<int64_t> known;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      unknown = static_cast<int>(i);
    } else {
      known.push_back(shape[i]);
    }
  }
  const uint64_t unit = checked_nbytes(known.data(), known.size(), spec.dtype, name);
  const std::string declared = fmt::format("{} with shape [{}]", dtype_name(spec.dtype), fmt::join(spec.shape, ", "));
  if (unknown >= 0) {
    if (unit == 0 || size % unit != 0) {
      throw bad_input("{}: raw file of {} bytes cannot hold {}: {} is not a multiple of {} bytes (the other "
                      "dimensions × {} bytes per element) — wrong --dtype or --shape?",
                      name, size, declared, size, unit, dtype_size(spec.dtype));
    }
    shape[static_cast<size_t>(unknown)] = static_cast<int64_t>(size / unit);
  } else if (unit != size) {
    throw bad_input("{}: raw file holds {} bytes but {} needs {} bytes — wrong --dtype or --shape?", name, size,
                    declared, unit);
  }
  return shape;
}

Array read_raw(const std::string& path, const RawSpec& spec) {
  auto file = MappedFile::open(path);
  Array a;
  a.dtype = spec.dtype;
  a.shape = resolve_raw_shape(file->size(), spec, path);
  a.strides = Array::c_strides(a.shape);
  a.data = file->data();
  a.owner = file;
  return a;
}

void write_raw(const std::string& path, const Array& array) {
  AtomicFile f(path);
  write_c_order(f, array);
  f.commit();
}

}  // namespace crucible::io
