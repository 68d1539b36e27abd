// loadtxt / savetxt equivalents.
#include "crucible/io/text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"

namespace crucible::io {
namespace {

// Splits a line into fields by `delim` ("" = whitespace runs).
void split(const char* b, const char* e, const std::string& delim, std::vector<std::pair<const char*, const char*>>& out) {
  out.clear();
  if (delim.empty()) {
    const char* p = b;
    while (p < e) {
      while (p < e && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
      if (p >= e) break;
      const char* s = p;
      while (p < e && *p != ' ' && *p != '\t' && *p != '\r') ++p;
      out.emplace_back(s, p);
    }
    return;
  }
  const char* s = b;
  const char* p = b;
  while (e - p >= static_cast<std::ptrdiff_t>(delim.size())) {
    if (std::memcmp(p, delim.data(), delim.size()) == 0) {
      out.emplace_back(s, p);
      p += delim.size();
      s = p;
    } else {
      ++p;
    }
  }
  out.emplace_back(s, e);
}

double parse_number(const char* b, const char* e, const std::string& name, int64_t line, size_t col) {
  while (b < e && (*b == ' ' || *b == '\t' || *b == '\r')) ++b;
  while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) --e;
  const char* s = b;
  if (s < e && *s == '+') ++s;
  double v = 0;
  auto r = std::from_chars(s, e, v);
  if (b == e || r.ec != std::errc() || r.ptr != e) {
    throw bad_input("{}:{}: column {}: cannot read '{}' as a number", name, line, col + 1,
                    std::string(b, std::min<size_t>(e - b, 40)));
  }
  return v;
}

// Checks that `fmt` holds exactly one printf conversion for a number; returns its letter.
char check_format(const std::string& f) {
  char conv = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') continue;
    if (i + 1 < f.size() && f[i + 1] == '%') {
      ++i;
      continue;
    }
    if (conv != 0) throw bad_input("text format '{}': more than one % conversion", f);
    size_t j = i + 1;
    while (j < f.size() && std::strchr("-+ 0#", f[j]) != nullptr) ++j;
    while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) ++j;
    if (j < f.size() && f[j] == '.') {
      ++j;
      while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) ++j;
    }
    if (j >= f.size() || std::strchr("eEfFgGdi", f[j]) == nullptr) {
      throw bad_input("text format '{}': expected one conversion such as %.18e, %g, %.6f or %d", f);
    }
    conv = f[j];
    i = j;
  }
  if (conv == 0) throw bad_input("text format '{}': no % conversion", f);
  return conv;
}

}  // namespace

Array parse_text(const char* data, size_t size, const std::string& name, const TextOptions& o) {
  std::vector<double> values;
  int64_t rows = 0, cols = -1;
  const char* p = data;
  const char* end = data + size;
  int64_t line = 0;
  std::vector<std::pair<const char*, const char*>> fields;
  std::string delim;
  bool delim_known = false;
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    const char* le = nl != nullptr ? nl : end;
    const char* b = p;
    p = nl != nullptr ? nl + 1 : end;
    ++line;
    if (line <= o.skip_rows) continue;
    const char* e = le;
    if (!o.comments.empty()) {
      for (const char* c = b; c + o.comments.size() <= e; ++c) {
        if (std::memcmp(c, o.comments.data(), o.comments.size()) == 0) {
          e = c;
          break;
        }
      }
    }
    bool blank = true;
    for (const char* c = b; c < e; ++c) blank &= (*c == ' ' || *c == '\t' || *c == '\r');
    if (blank) continue;
    if (!delim_known) {  // "" = whitespace, unless the first data line is comma-separated
      delim = o.delimiter.empty() && std::memchr(b, ',', static_cast<size_t>(e - b)) != nullptr ? "," : o.delimiter;
      delim_known = true;
    }
    split(b, e, delim, fields);
    const int64_t nf = static_cast<int64_t>(fields.size());
    std::vector<int64_t> pick = o.use_cols;
    if (pick.empty()) {
      for (int64_t c = 0; c < nf; ++c) pick.push_back(c);
    }
    if (cols >= 0 && static_cast<int64_t>(pick.size()) != cols) {
      throw bad_input("{}:{}: {} columns, but earlier rows have {}", name, line, pick.size(), cols);
    }
    cols = static_cast<int64_t>(pick.size());
    for (int64_t c : pick) {
      const int64_t k = c < 0 ? c + nf : c;
      if (k < 0 || k >= nf) throw bad_input("{}:{}: column {} does not exist (the line has {})", name, line, c, nf);
      values.push_back(parse_number(fields[k].first, fields[k].second, name, line, static_cast<size_t>(k)));
    }
    ++rows;
  }
  std::vector<int64_t> shape;
  if (rows == 0) {
    shape = {0};
  } else if (cols == 1) {
    shape = {rows};
  } else if (rows == 1) {
    shape = {cols};
  } else {
    shape = {rows, cols};
  }
  std::vector<uint8_t> bytes(values.size() * sizeof(double));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return Array::owned(DType::kF64, shape, std::move(bytes));
}

Array read_text(const std::string& path, const TextOptions& options) {
  auto file = MappedFile::open(path);
  return parse_text(reinterpret_cast<const char*>(file->data()), file->size(), path, options);
}

void write_text(const std::string& path, const Array& array, const TextOptions& o) {
  if (array.shape.size() > 2) {
    throw bad_input("{}: text holds 1-D or 2-D arrays; this one has shape {}", path, array.shape_string());
  }
  const char conv = check_format(o.fmt);
  const bool integer = conv == 'd' || conv == 'i';
  std::vector<double> v(static_cast<size_t>(array.numel()));
  for_each_double(array, path, [&v](int64_t i, double x) { v[static_cast<size_t>(i)] = x; });
  const int64_t cols = array.shape.size() == 2 ? array.shape[1] : 1;
  const std::string delim = o.delimiter.empty() ? " " : o.delimiter;
  std::string out;
  char buf[512];
  for (size_t i = 0; i < v.size(); ++i) {
    int n = integer ? std::snprintf(buf, sizeof(buf), o.fmt.c_str(), static_cast<long long>(std::llround(v[i])))
                    : std::snprintf(buf, sizeof(buf), o.fmt.c_str(), v[i]);
    out.append(buf, static_cast<size_t>(std::min<int>(n, sizeof(buf) - 1)));
    out += (static_cast<int64_t>(i % static_cast<size_t>(cols)) == cols - 1) ? "\n" : delim;
  }
  write_file_atomic(path, out);
}

}  // namespace crucible::io
