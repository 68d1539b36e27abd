// Law 5: checkpoints round-trip every tensor bit for bit, any flipped byte or truncation is
// detected, the newest valid one is taken with a warning for each skipped, and only `keep`
// remain. Files open as plain safetensors.
#include "crucible/train/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::train {
namespace {

CheckpointData sample(int64_t step) {
  CheckpointData d;
  d.tensors.push_back({"model.w", at::randn({3, 4})});
  d.tensors.push_back({"model.b", at::arange(5, at::kLong)});
  d.tensors.push_back({"rng", at::randint(0, 255, {16}, at::kByte)});
  d.tensors.push_back({"half", at::randn({2}).to(at::kBFloat16)});
  d.meta["step"] = std::to_string(step);
  return d;
}

TEST(Checkpoint, RoundTripsBitForBit) {
  test::TempDir d;
  CheckpointData a = sample(7);
  write_checkpoint(d / "c.safetensors", a);
  CheckpointData b = read_checkpoint(d / "c.safetensors");
  EXPECT_EQ(b.meta.at("step"), "7");
  for (const auto& t : a.tensors) {
    const at::Tensor* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_TRUE(at::equal(t.tensor, *u)) << t.name;
  }
}

TEST(Checkpoint, AnyFlippedByteIsDetected) {
  test::TempDir d;
  write_checkpoint(d / "c", sample(1));
  const std::string good = test::read_text(d / "c");
  int detected = 0, tried = 0;
  for (size_t pos = 0; pos < good.size(); pos += 7) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x01);
    test::write_text(d / "bad", bad);
    ++tried;
    try {
      read_checkpoint(d / "bad");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      ++detected;
    }
  }
  // A flip inside JSON whitespace padding changes nothing that is read; everything else counts.
  EXPECT_GE(detected, tried - 3);
}

TEST(Checkpoint, ManagerKeepsNewestAndFallsBackPastCorruptOnes) {
  test::TempDir d;
  CheckpointManager m(d / "ckpt", 2);
  for (int64_t s : {10, 20, 30}) m.save(s, sample(s));
  auto files = m.list();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].find("ckpt-000000020"), std::string::npos);
  // Truncate the newest: load falls back to step 20 and warns.
  std::string newest = test::read_text(files[1]);
  test::write_text(files[1], newest.substr(0, newest.size() / 2));
  testing::internal::CaptureStderr();
  std::string path;
  auto c = m.load_latest(&path);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->meta.at("step"), "20");
  EXPECT_NE(err.find("skipping checkpoint"), std::string::npos) << err;
  EXPECT_NE(err.find("ckpt-000000030"), std::string::npos) << err;
  // A stray temporary from a killed writer is never taken and is cleaned on the next save.
  test::write_text(d / "ckpt/ckpt-000000040.safetensors.tmp-999", "partial");
  EXPECT_EQ(m.load_latest()->meta.at("step"), "20");
  m.save(50, sample(50));
  EXPECT_FALSE(std::filesystem::exists(d / "ckpt/ckpt-000000040.safetensors.tmp-999"));
}

TEST(Checkpoint, PythonReadsItAsSafetensors) {
  test::TempDir d;
  CheckpointData a;
  a.tensors.push_back({"model.w", at::tensor({1.5f, -2.0f})});
  write_checkpoint(d / "c.safetensors", a);
  const std::string out = test::run_python(
      test::python_read_safetensors(d / "c.safetensors") +
      "s, e = h['model.w']['data_offsets']\n"
      "print(h['__metadata__']['crucible.format'], np.frombuffer(b[8+n+s:8+n+e], '<f4').tolist())\n");
  EXPECT_EQ(out, "checkpoint-1 [1.5, -2.0]\n");
}

}  // namespace
}  // namespace crucible::train
