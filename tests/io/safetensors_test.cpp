// safetensors: what crucible writes Python's reader would accept (layout checked byte by
// byte against the spec), and a truncated or inconsistent file is a precise bad-input error.
#include "crucible/io/safetensors.h"

#include <gtest/gtest.h>

#include "crucible/core/error.h"
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
