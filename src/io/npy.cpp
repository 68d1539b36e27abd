// .npy reader and writer. The header is a Python dict literal; no Debian package parses
// those from C++, so a small tokenizer here does (hand-written, bounded).
#include "crucible/io/npy.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"

namespace crucible::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMaxHeader = 1 << 20;  // NumPy refuses > 10000 by default; stay bounded

// A cursor over the header text with the offset of each token for messages.
class DictParser {
 public:
  DictParser(const char* text, size_t size, size_t base, const std::string& name)
      : p_(text), end_(text + size), base_(base), name_(name), start_(text) {}

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool peek(char c) {
    skip_ws();
    return p_ < end_ && *p_ == c;
  }
  void expect(char c) {
    skip_ws();
    if (p_ >= end_ || *p_ != c) fail(fmt::format("expected '{}'", c));
    ++p_;
  }
  std::string string_literal() {
    skip_ws();
    if (p_ >= end_ || (*p_ != '\'' && *p_ != '"')) fail("expected a quoted string");
    const char q = *p_++;
    std::string out;
    while (p_ < end_ && *p_ != q) {
      if (*p_ == '\\') fail("escapes are not used in .npy headers");
      out += *p_++;
    }
    if (p_ >= end_) fail("unterminated string");
    ++p_;
    return out;
  }
  bool boolean() {
    skip_ws();
    if (match("True")) return true;
    if (match("False")) return false;
    fail("expected True or False");
    return false;
  }
  int64_t integer() {
    skip_ws();
    const char* s = p_;
    int64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      if (v > (INT64_MAX - 9) / 10) fail("dimension too large");
      v = v * 10 + (*p_++ - '0');
    }
    if (p_ == s) fail("expected a non-negative integer");
    if (p_ < end_ && (*p_ == 'L' || *p_ == 'l')) ++p_;  // Python 2 writers: 3L
    return v;
  }
  bool at_end() {
    skip_ws();
    return p_ >= end_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw bad_input("{}: byte {}: invalid .npy header: {} (header: {})", name_, base_ + (p_ - start_), what,
                    std::string(start_, std::min<size_t>(end_ - start_, 200)));
  }

 private:
  bool match(const char* word) {
    size_t n = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) >= n && std::memcmp(p_, word, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }

  const char* p_;
  const char* end_;
  size_t base_;
  const std::string& name_;
  const char* start_;
};

// descr → dtype and byte order.
void parse_descr(const std::string& descr, NpyHeader& h, DictParser& parser) {
  if (descr.empty()) parser.fail("empty descr");
  size_t i = 0;
  char order = '=';
  if (descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=') order = descr[i++];
  const std::string rest = descr.substr(i);
  static const struct {
    const char* code;
    DType type;
  } kCodes[] = {{"b1", DType::kBool}, {"?", DType::kBool},  {"i1", DType::kI8},   {"i2", DType::kI16},
                {"i4", DType::kI32},  {"i8", DType::kI64},  {"u1", DType::kU8},   {"u2", DType::kU16},
                {"u4", DType::kU32},  {"u8", DType::kU64},  {"f2", DType::kF16},  {"f4", DType::kF32},
                {"f8", DType::kF64},  {"c8", DType::kC64},  {"c16", DType::kC128}};
  for (const auto& c : kCodes) {
    if (rest == c.code) {
      h.dtype = c.type;
      h.big_endian = order == '>' && dtype_size(c.type) > 1;
      return;
    }
  }
  const char kind = rest.empty() ? '?' : rest[0];
  const char* why = kind == 'O'   ? "Python objects (pickled; never loaded)"
                    : kind == 'U' || kind == 'S' ? "strings"
                    : kind == 'V' ? "raw bytes or a structured record"
                    : kind == 'M' || kind == 'm' ? "dates/times"
                                                 : "an unknown dtype";
  parser.fail(fmt::format("descr '{}' is {}; crucible reads numeric arrays only", descr, why));
}

}  // namespace

uint64_t npy_header_length(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 10 || std::memcmp(data, kMagic, 6) != 0) {
    throw bad_input("{}: byte 0: not a .npy file: expected the magic \\x93NUMPY, found {} bytes starting {:02x}", name,
                    size, fmt::join(data, data + std::min<size_t>(size, 6), " "));
  }
  const int major = data[6], minor = data[7];
  size_t len_bytes;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    throw bad_input("{}: byte 6: unsupported .npy format version {}.{} (known: 1.0, 2.0, 3.0)", name, major, minor);
  }
  if (size < 8 + len_bytes) throw bad_input("{}: truncated .npy header at byte 8", name);
  uint64_t hlen = 0;
  for (size_t i = 0; i < len_bytes; ++i) hlen |= static_cast<uint64_t>(data[8 + i]) << (8 * i);
  if (hlen > kMaxHeader) throw bad_input("{}: byte 8: header length {} is larger than the 1 MiB limit", name, hlen);
  return 8 + len_bytes + hlen;
}

NpyHeader parse_npy_header_prefix(const uint8_t* data, size_t size, const std::string& name) {
  const uint64_t end = npy_header_length(data, size, name);
  NpyHeader h;
  h.major = data[6];
  h.minor = data[7];
  const uint64_t start = h.major == 1 ? 10 : 12;
  const uint64_t hlen = end - start;
  if (end > size) {
    throw bad_input("{}: byte 8: header length {} runs past the end of the file ({} bytes)", name, hlen, size);
  }
  DictParser p(reinterpret_cast<const char*>(data + start), hlen, start, name);
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.peek('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr") {
      if (p.peek('[')) p.fail("structured dtypes (a list descr) are not supported");
      parse_descr(p.string_literal(), h, p);
      have_descr = true;
    } else if (key == "fortran_order") {
      h.fortran_order = p.boolean();
      have_order = true;
    } else if (key == "shape") {
      p.expect('(');
      while (!p.peek(')')) {
        if (h.shape.size() >= 64) p.fail("more than 64 dimensions");
        h.shape.push_back(p.integer());
        if (!p.peek(')')) p.expect(',');
      }
      p.expect(')');
      have_shape = true;
    } else {
      p.fail(fmt::format("unexpected key '{}' (a .npy header holds descr, fortran_order and shape)", key));
    }
    if (!p.peek('}')) p.expect(',');
  }
  p.expect('}');
  if (!have_descr || !have_order || !have_shape) p.fail("missing descr, fortran_order or shape");
  h.data_offset = end;
  (void)checked_nbytes(h.shape.data(), h.shape.size(), h.dtype, name);  // refuse an overflowing shape here
  return h;
}

NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& name) {
  const NpyHeader h = parse_npy_header_prefix(data, size, name);
  const uint64_t need = checked_nbytes(h.shape.data(), h.shape.size(), h.dtype, name);
  const uint64_t have = size - h.data_offset;
  if (need != have) {
    throw bad_input("{}: byte {}: shape ({}) of {} needs {} data bytes, the file holds {}{}", name, h.data_offset,
                    fmt::join(h.shape, ", "), dtype_name(h.dtype), need, have,
                    have < need ? " (truncated?)" : " (trailing bytes)");
  }
  return h;
}

Array parse_npy(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner) {
  const NpyHeader h = parse_npy_header(data, size, name);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  if (h.fortran_order) {  // column-major: stride 1 on the first axis
    a.strides.resize(h.shape.size());
    int64_t acc = 1;
    for (size_t i = 0; i < h.shape.size(); ++i) {
      a.strides[i] = acc;
      if (__builtin_mul_overflow(acc, std::max<int64_t>(h.shape[i], 1), &acc)) acc = INT64_MAX;  // empty arrays only
    }
  } else {
    a.strides = Array::c_strides(h.shape);
  }
  if (!h.big_endian) {
    a.data = data + h.data_offset;
    a.owner = std::move(owner);
    return a;
  }
  auto buf = std::make_shared<std::vector<uint8_t>>(data + h.data_offset, data + size);
  byteswap(buf->data(), static_cast<uint64_t>(a.numel()), a.dtype);
  a.data = buf->data();
  a.owner = buf;
  return a;
}

Array read_npy(const std::string& path) {
  auto file = MappedFile::open(path);
  return parse_npy(file->data(), file->size(), path, file);
}

std::string npy_descr(DType t, const std::string& what) {
  switch (t) {
    case DType::kBool:
      return "|b1";
    case DType::kU8:
      return "|u1";
    case DType::kI8:
      return "|i1";
    case DType::kBF16:
    case DType::kF8E5M2:
    case DType::kF8E4M3:
      throw bad_input("{}: NumPy has no {} dtype; write safetensors, or convert with --dtype float32", what,
                      dtype_name(t));
    default: {
      static const struct {
        DType type;
        const char* descr;
      } kDescr[] = {{DType::kI16, "<i2"}, {DType::kI32, "<i4"}, {DType::kI64, "<i8"}, {DType::kU16, "<u2"},
                    {DType::kU32, "<u4"}, {DType::kU64, "<u8"}, {DType::kF16, "<f2"}, {DType::kF32, "<f4"},
                    {DType::kF64, "<f8"}, {DType::kC64, "<c8"}, {DType::kC128, "<c16"}};
      for (const auto& d : kDescr) {
        if (d.type == t) return d.descr;
      }
      throw std::logic_error("npy_descr: unhandled dtype");
    }
  }
}

std::string npy_header(const Array& array, const std::string& what) {
  std::string shape;
  for (int64_t d : array.shape) shape += fmt::format("{}, ", d);
  if (array.shape.size() == 1) {
    shape.resize(shape.size() - 1);  // "(3,)"
  } else if (!shape.empty()) {
    shape.resize(shape.size() - 2);  // "(3, 4)"
  }
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", npy_descr(array.dtype, what), shape);
  // NumPy pads with spaces so that magic + version + length + header is a multiple of 64.
  size_t len_bytes = 2;
  if (dict.size() + 1 + 10 > 65535) len_bytes = 4;
  const size_t prefix = 8 + len_bytes;
  size_t total = prefix + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic, 6);
  out += static_cast<char>(len_bytes == 2 ? 1 : 2);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  out += dict;
  return out;
}

std::string npy_bytes(const Array& array, const std::string& what) {
  std::string out = npy_header(array, what);
  const std::vector<uint8_t> body = array.c_order_bytes();
  out.append(reinterpret_cast<const char*>(body.data()), body.size());
  return out;
}

void write_npy(const std::string& path, const Array& array) {
  AtomicFile f(path);
  f.write(npy_header(array, path));
  write_c_order(f, array);
  f.commit();
}

}  // namespace crucible::io
