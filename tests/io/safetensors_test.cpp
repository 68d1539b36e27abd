// safetensors: what crucible writes Python's reader would accept (layout checked byte by
// byte against the spec), and a truncated or inconsistent file is a precise bad-input error.
#include "crucible/io/safetensors.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"
#include "test_util.h"

namespace crucible::io {
namespace {

TEST(Safetensors, RoundTripWithMetadata) {
  test::TempDir d;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, -8};
  write_safetensors(d / "x.safetensors",
                    {{"w", DType::kF32, {2, 3}, a.data(), 24}, {"n", DType::kI64, {2}, b.data(), 16}},
                    {{"k", "v"}});
  auto f = SafetensorsFile::read(d / "x.safetensors");
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.metadata().at("k"), "v");
  const auto* w = f.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(f.data(*w), a.data(), 24), 0);
  const std::string raw = test::read_text(d / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // header padded to 8 bytes
  EXPECT_EQ(raw.size(), 8 + n + 40);
}

TEST(Safetensors, NumpyReadsWhatWeWrite) {
  test::TempDir d;
  std::vector<float> a = {0.5f, -1.25f, 3.0f};
  write_safetensors(d / "x.safetensors", {{"t", DType::kF32, {3}, a.data(), 12}}, {});
  const std::string out = test::run_python(
      test::python_read_safetensors(d / "x.safetensors") +
      "s, e = h['t']['data_offsets']\n"
      "print(h['t']['dtype'], np.frombuffer(b[8+n+s:8+n+e], '<f4').tolist())\n");
  EXPECT_EQ(out, "F32 [0.5, -1.25, 3.0]\n");
}

TEST(Safetensors, TruncatedAndInconsistentFilesAreBadInput) {
  test::TempDir d;
  std::vector<float> a(16, 1.0f);
  write_safetensors(d / "x", {{"t", DType::kF32, {16}, a.data(), 64}}, {});
  const std::string raw = test::read_text(d / "x");
  for (size_t cut : {size_t{3}, size_t{20}, raw.size() - 1}) {
    test::write_text(d / "cut", raw.substr(0, cut));
    try {
      SafetensorsFile::read(d / "cut");
      FAIL() << "cut at " << cut;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find("cut"), std::string::npos) << e.what();
    }
  }
  test::write_text(d / "long", raw + "extra");
  EXPECT_THROW(SafetensorsFile::read(d / "long"), Error);
}

}  // namespace
}  // namespace crucible::io

namespace crucible::io {
namespace {

// Every safetensors dtype, both directions: Python writes (json + numpy bytes, as the
// reference implementation lays them out) and crucible reads bit-exact; crucible writes and
// Python reads back the same bytes.
TEST(Safetensors, EveryDtypeBothDirectionsBitExact) {
  test::TempDir d;
  const std::string out = test::run_python(
      "import json, struct, numpy as np, hashlib\n"
      "rng = np.random.default_rng(3)\n"
      "names = ['BOOL','U8','I8','I16','U16','I32','U32','I64','U64','F16','BF16','F32','F64','F8_E5M2','F8_E4M3']\n"
      "size = {'BOOL':1,'U8':1,'I8':1,'I16':2,'U16':2,'I32':4,'U32':4,'I64':8,'U64':8,'F16':2,'BF16':2,'F32':4,'F64':8,'F8_E5M2':1,'F8_E4M3':1}\n"
      "header, data, off = {'__metadata__': {'source': 'python'}}, b'', 0\n"
      "for n in names:\n"
      "    raw = rng.integers(0, 2 if n == 'BOOL' else 256, size=6 * size[n], dtype=np.uint8).tobytes()\n"
      "    header[n.lower()] = {'dtype': n, 'shape': [2, 3], 'data_offsets': [off, off + len(raw)]}\n"
      "    off += len(raw); data += raw\n"
      "    print(n.lower(), n, hashlib.sha256(raw).hexdigest())\n"
      "h = json.dumps(header).encode(); h += b' ' * ((8 - len(h) % 8) % 8)\n"
      "open('" + (d / "py.safetensors") + "', 'wb').write(struct.pack('<Q', len(h)) + h + data)\n");
  auto f = SafetensorsFile::read(d / "py.safetensors");
  EXPECT_EQ(f.metadata().at("source"), "python");
  std::istringstream in(out);
  std::string name, st, sha;
  int n = 0;
  std::vector<NamedArray> arrays;
  while (in >> name >> st >> sha) {
    const auto* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_STREQ(dtype_safetensors_name(e->dtype), st.c_str());
    Array a = f.array(*e);
    const std::vector<uint8_t> bytes = a.c_order_bytes();
    EXPECT_EQ(sha256_hex(std::string(bytes.begin(), bytes.end())), sha) << name;
    arrays.push_back({name, a});
    ++n;
  }
  EXPECT_EQ(n, 15);
  write_safetensors(d / "cr.safetensors", arrays, {{"source", "crucible"}});
  const std::string back = test::run_python(
      test::python_read_safetensors(d / "cr.safetensors") +
      "import hashlib\n"
      "for k, v in h.items():\n"
      "    if k != '__metadata__':\n"
      "        s, e = v['data_offsets']; print(k, v['dtype'], hashlib.sha256(b[8+n+s:8+n+e]).hexdigest())\n"
      "print('meta', h['__metadata__']['source'])\n");
  std::istringstream bin(back);
  std::map<std::string, std::string> got;
  while (bin >> name >> st) {
    if (name == "meta") {
      EXPECT_EQ(st, "crucible");
      break;
    }
    bin >> sha;
    got[name] = st + " " + sha;
  }
  std::istringstream again(out);
  while (again >> name >> st >> sha) EXPECT_EQ(got[name], st + " " + sha) << name;
}

TEST(Safetensors, DuplicateNamesAreRefused) {
  test::TempDir d;
  const std::string json = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(json.size());
  file += json + "xy";
  test::write_text(d / "dup.safetensors", file);
  test::expect_bad_input([&] { SafetensorsFile::read(d / "dup.safetensors"); }, {"'a' appears twice"});
}

}  // namespace
}  // namespace crucible::io
