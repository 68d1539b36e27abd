// .npy against NumPy (python3-numpy is the oracle): every dtype, both byte orders, C and
// Fortran order, 0-d and empty, format versions 1.0/2.0/3.0, read by crucible and written by
// crucible, bit-exact both ways; malformed headers are bad input with the byte offset (D12).
// To add a case: extend the Python `cases` list in kCases.
#include "crucible/io/npy.h"

#include <gtest/gtest.h>

#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"
#include "test_util.h"

namespace crucible::io {
namespace {

using test::expect_bad_input;

// Python that builds `cases`: (name, array) with random bytes for every dtype and layout.
const char* kCases = R"py(
import numpy as np, hashlib, os
rng = np.random.default_rng(0)
codes = ['b1', 'i1', 'u1', 'i2', 'u2', 'i4', 'u4', 'i8', 'u8', 'f2', 'f4', 'f8', 'c8', 'c16']
cases = []
for code in codes:
    for order in '<>':
        if code in ('b1', 'i1', 'u1') and order == '>':
            continue
        for shape, fortran in [((2, 3, 4), False), ((2, 3, 4), True), ((), False), ((0, 3), False), ((5,), False)]:
            n = int(np.prod(shape))
            dt = np.dtype(order + code)
            if code == 'b1':
                a = rng.integers(0, 2, size=n).astype(bool)
            else:
                a = np.frombuffer(rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).tobytes(), dtype=dt)
            a = a.reshape(shape)
            a = np.asfortranarray(a) if fortran else np.ascontiguousarray(a)
            cases.append((f'{code}_{"be" if order == ">" else "le"}_{"F" if fortran else "C"}_{len(shape)}d', a))
cases.append(('v2', np.arange(6, dtype='<f8').reshape(2, 3)))
cases.append(('v3', np.arange(6, dtype='<i4').reshape(3, 2)))
def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a.astype(a.dtype.newbyteorder('<'))).tobytes()).hexdigest()
)py";

std::string digest(const Array& a) {
  const std::vector<uint8_t> b = a.c_order_bytes();
  return sha256_hex(std::string(b.begin(), b.end()));
}

std::string shape_csv(const Array& a) { return a.shape.empty() ? "-" : fmt::format("{}", fmt::join(a.shape, ",")); }

TEST(Npy, ReadsWhatNumpyWritesBitExact) {
  test::TempDir d;
  const std::string out = test::run_python(std::string(kCases) + "dir = '" + d.path() + R"py('
for name, a in cases:
    with open(os.path.join(dir, name + '.npy'), 'wb') as f:
        version = (2, 0) if name == 'v2' else (3, 0) if name == 'v3' else None
        np.lib.format.write_array(f, a, version=version)
    print(name, a.dtype.str[1:], ','.join(map(str, a.shape)) or '-', digest(a))
)py");
  std::istringstream in(out);
  std::string name, code, shape, sha;
  int n = 0;
  while (in >> name >> code >> shape >> sha) {
    ++n;
    Array a = read_npy(d / (name + ".npy"));
    DType want;
    ASSERT_TRUE(dtype_from_name(code, &want)) << code;
    EXPECT_EQ(a.dtype, want) << name;
    EXPECT_EQ(shape_csv(a), shape) << name;
    EXPECT_EQ(digest(a), sha) << name;
  }
  EXPECT_GE(n, 100);
}

TEST(Npy, NumpyReadsWhatCrucibleWritesBitExact) {
  test::TempDir d;
  // NumPy writes the originals; crucible reads each and writes it again; NumPy compares.
  test::run_python(std::string(kCases) + "dir = '" + d.path() + R"py('
for name, a in cases:
    np.save(os.path.join(dir, name + '.npy'), a)
open(os.path.join(dir, 'names'), 'w').write('\n'.join(n for n, _ in cases))
)py");
  std::istringstream names(test::read_text(d / "names"));
  int n = 0;
  for (std::string name; std::getline(names, name);) {
    write_npy(d / (name + ".out.npy"), read_npy(d / (name + ".npy")));
    ++n;
  }
  const std::string out = test::run_python(std::string(kCases) + "dir = '" + d.path() + R"py('
bad = []
for name, a in cases:
    b = np.load(os.path.join(dir, name + '.out.npy'))
    if b.dtype != a.dtype.newbyteorder('<') and b.dtype != a.dtype or b.shape != a.shape or digest(b) != digest(a):
        bad.append(name)
print('mismatch:', ' '.join(bad) if bad else 'none')
)py");
  EXPECT_EQ(out, "mismatch: none\n");
  EXPECT_GE(n, 100);
}

TEST(Npy, HeaderIsAlignedAsNumpyWritesIt) {
  Array a = Array::owned(DType::kF32, {3, 4}, std::vector<uint8_t>(48, 0));
  const std::string bytes = npy_bytes(a, "x");
  EXPECT_EQ(bytes.size(), 128u + 48u);  // reference: <f4 (3, 4) → data at byte 128
  EXPECT_EQ(bytes.substr(10, 60), "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } ");
  EXPECT_EQ(bytes[127], '\n');
}

TEST(Npy, MalformedFilesAreBadInputWithOffsets) {
  Array a = Array::owned(DType::kF32, {3, 4}, std::vector<uint8_t>(48, 1));
  const std::string good = npy_bytes(a, "x");
  auto parse = [](const std::string& s) {
    return parse_npy(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "f.npy", nullptr);
  };
  expect_bad_input([&] { parse("PK\x03\x04 not numpy"); }, {"f.npy", "byte 0", "not a .npy file"});
  expect_bad_input([&] { parse(good.substr(0, 60)); }, {"byte 8", "runs past the end"});
  expect_bad_input([&] { parse(good.substr(0, good.size() - 4)); }, {"needs 48 data bytes", "holds 44", "truncated"});
  expect_bad_input([&] { parse(good + "xx"); }, {"trailing bytes"});
  std::string v = good;
  v[6] = 9;
  expect_bad_input([&] { parse(v); }, {"version 9.0"});
  auto with_dict = [&](const std::string& dict) {
    std::string h = dict;
    h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
    h += '\n';
    std::string s = std::string("\x93NUMPY\x01\x00", 8);
    s += static_cast<char>(h.size() & 0xff);
    s += static_cast<char>(h.size() >> 8);
    return s + h + std::string(48, '\0');
  };
  expect_bad_input([&] { parse(with_dict("{'descr': '|O', 'fortran_order': False, 'shape': (6,), }")); },
                   {"'|O'", "Python objects"});
  expect_bad_input([&] { parse(with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (12,), }")); },
                   {"structured"});
  expect_bad_input([&] { parse(with_dict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (12,), }")); },
                   {"True or False"});
  expect_bad_input([&] { parse(with_dict("{'descr': '<f4', 'shape': (12,), }")); }, {"missing"});
  // Python 2 writers put an L after integers: accepted.
  EXPECT_EQ(parse(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }")).numel(), 12);
  expect_bad_input([&] { parse(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }")); },
                   {"overflows"});
}

TEST(Npy, BfloatHasNoNumpyType) {
  Array a = Array::owned(DType::kBF16, {2}, std::vector<uint8_t>(4, 0));
  expect_bad_input([&] { npy_bytes(a, "out.npy"); }, {"out.npy", "bfloat16", "safetensors"});
}

}  // namespace
}  // namespace crucible::io
