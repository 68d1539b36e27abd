// Array helpers: contiguity, C-order copies, byte swapping.
#include "crucible/io/array.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fp16.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::io {

namespace {

// a * b clamped to INT64_MAX: strides of an empty array may exceed any real size, and
// readers have already checked the byte count of every non-empty one.
int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

}  // namespace

int64_t Array::numel() const {
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t d : shape) n = mul_sat(n, d);
  return n;
}

std::vector<int64_t> Array::c_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc = mul_sat(acc, std::max<int64_t>(shape[i], 1));
  }
  return s;
}

bool Array::is_c_contiguous() const {
  if (numel() == 0) return true;
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != acc) return false;
    acc = mul_sat(acc, shape[i]);
  }
  return true;
}

std::vector<uint8_t> Array::c_order_bytes() const {
  const size_t item = dtype_size(dtype);
  std::vector<uint8_t> out(nbytes());
  if (out.empty()) return out;
  if (is_c_contiguous()) {
    std::memcpy(out.data(), data, out.size());
    return out;
  }
  const size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  const int64_t n = numel();
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += idx[d] * strides[d];
    std::memcpy(out.data() + static_cast<size_t>(k) * item, data + off * static_cast<int64_t>(item), item);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Array Array::contiguous() const {
  if (is_c_contiguous()) {
    Array a = *this;
    a.strides = c_strides(shape);
    return a;
  }
  return owned(dtype, shape, c_order_bytes());
}

std::string Array::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Array Array::owned(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  Array a;
  a.dtype = dtype;
  a.strides = c_strides(shape);
  a.shape = std::move(shape);
  a.data = buf->data();
  a.owner = buf;
  return a;
}

namespace {

float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float8 e4m3fn (no infinities; S.1111.111 is NaN), as in safetensors F8_E4M3.
float f8e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
  float mag;
  if (exp == 15 && man == 7) {
    mag = NAN;
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man) / 8.0f, -6);
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return sign ? -mag : mag;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double element(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kBool:
      return *p != 0 ? 1.0 : 0.0;
    case DType::kU8:
      return *p;
    case DType::kI8:
      return static_cast<int8_t>(*p);
    case DType::kI16:
      return load<int16_t>(p);
    case DType::kI32:
      return load<int32_t>(p);
    case DType::kI64:
      return static_cast<double>(load<int64_t>(p));
    case DType::kU16:
      return load<uint16_t>(p);
    case DType::kU32:
      return load<uint32_t>(p);
    case DType::kU64:
      return static_cast<double>(load<uint64_t>(p));
    case DType::kF16:
      return fp16_ieee_to_fp32_value(load<uint16_t>(p));
    case DType::kBF16:
      return bf16_to_float(load<uint16_t>(p));
    case DType::kF32:
      return load<float>(p);
    case DType::kF64:
      return load<double>(p);
    case DType::kF8E5M2:  // the high byte of an IEEE half
      return fp16_ieee_to_fp32_value(static_cast<uint16_t>(*p) << 8);
    case DType::kF8E4M3:
      return f8e4m3_to_float(*p);
    case DType::kC64:
    case DType::kC128:
      break;
  }
  return 0;
}

}  // namespace

void for_each_double(const Array& array, const std::string& what, const std::function<void(int64_t, double)>& fn) {
  if (dtype_is_complex(array.dtype)) throw bad_input("{}: {} values have no single number form", what, dtype_name(array.dtype));
  const int64_t item = static_cast<int64_t>(dtype_size(array.dtype));
  const size_t nd = array.shape.size();
  const int64_t n = array.numel();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += idx[d] * array.strides[d];
    fn(k, element(array.dtype, array.data + off * item));
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < array.shape[d]) break;
      idx[d] = 0;
    }
  }
}

void write_c_order(AtomicFile& file, const Array& array) {
  if (array.is_c_contiguous()) {
    file.write(array.data, array.nbytes());
  } else {
    const std::vector<uint8_t> bytes = array.c_order_bytes();
    file.write(bytes.data(), bytes.size());
  }
}

void byteswap(uint8_t* data, uint64_t count, DType dtype) {
  size_t item = dtype_size(dtype);
  if (dtype_is_complex(dtype)) {  // real and imaginary parts swap separately
    item /= 2;
    count *= 2;
  }
  if (item == 1) return;
  for (uint64_t i = 0; i < count; ++i) std::reverse(data + i * item, data + (i + 1) * item);
}

}  // namespace crucible::io
