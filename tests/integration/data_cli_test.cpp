// `crucible bench loader` and `crucible pack` end to end: the digest is identical for 1, 2
// and 4 threads and across a mid-epoch save/restore; a folder with a corrupt JPEG and a
// truncated PNG finishes under "skip" naming both, and stops under "fail" naming the first
// (D5); packed shards give the same batches as the folder they came from.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;

using test::expect_contains;

void make_photos(const std::string& root, int n, bool with_bad) {
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(1)\n"
                   "for i in range(" + std::to_string(n) + "):\n"
                   "    d = os.path.join('" + root + "', 'class%d' % (i % 4)); os.makedirs(d, exist_ok=True)\n"
                   "    a = rng.integers(0, 256, (int(rng.integers(60, 200)), int(rng.integers(60, 200)), 3), dtype=np.uint8)\n"
                   "    Image.fromarray(a).save(os.path.join(d, '%04d.jpg' % i), quality=90)\n" +
                   std::string(with_bad ? "b = open(os.path.join('" + root + "', 'class1', '0001.jpg'), 'rb').read()\n"
                                          "open(os.path.join('" + root + "', 'class1', 'broken.jpg'), 'wb').write(b[:200] + b'\\x00' * 300 + b[500:])\n"
                                          "Image.fromarray(a).save(os.path.join('" + root + "', 'class2', 'cut.png'))\n"
                                          "p = open(os.path.join('" + root + "', 'class2', 'cut.png'), 'rb').read()\n"
                                          "open(os.path.join('" + root + "', 'class2', 'cut.png'), 'wb').write(p[:len(p) // 2])\n"
                                        : ""));
}

json bench(const std::vector<std::string>& extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), "bench", "loader", "--crop", "64", "--batch-size", "16",
                                  "--epochs", "2", "--digest", "--json", "--warmup", "1"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  auto r = test::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out.substr(r.out.rfind('{')));
}

TEST(BenchLoader, DigestSameForThreadsAndRestore) {
  test::TempDir d;
  make_photos(d / "photos", 48, false);
  const json one = bench({"--data", d / "photos", "--threads", "1"});
  EXPECT_EQ(one["images"], 96);
  EXPECT_GT(one["images_per_s"].get<double>(), 0);
  EXPECT_EQ(one["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(bench({"--data", d / "photos", "--threads", "2"})["digest"], one["digest"]);
  EXPECT_EQ(bench({"--data", d / "photos", "--threads", "4"})["digest"], one["digest"]);
  EXPECT_EQ(bench({"--data", d / "photos", "--threads", "2", "--split-at", "1"})["digest"], one["digest"]);
  // Packed shards of the same folder give the same batches.
  auto r = test::run_command({test::crucible_binary(), "pack", d / "photos", d / "packed"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(bench({"--data", d / "packed", "--threads", "2"})["digest"], one["digest"]);
}

TEST(BenchLoader, BadSamplesSkipNamesBothFailNamesFirstD5) {
  test::TempDir d;
  make_photos(d / "photos", 16, true);
  const json skip = bench({"--data", d / "photos", "--threads", "2", "--set", "data.bad_samples=skip"});
  EXPECT_EQ(skip["skipped"], 4);  // two bad files, two epochs
  const std::string names = skip["skipped_names"].dump();
  expect_contains(names, "broken.jpg");
  expect_contains(names, "cut.png");
  auto r = test::run_command({test::crucible_binary(), "bench", "loader", "--data", d / "photos", "--crop", "64",
                              "--batch-size", "16", "--threads", "2"});
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r.err, "broken.jpg");  // the first bad sample in epoch order
  expect_contains(r.err, "data.bad_samples");
  // pack --validate leaves both out and names them.
  r = test::run_command({test::crucible_binary(), "pack", d / "photos", d / "packed", "--validate"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.err, "broken.jpg");
  expect_contains(r.err, "cut.png");
}

TEST(BenchLoader, FashionMnistFolderUsesTheIdxPipeline) {
  auto r = test::run_command({test::crucible_binary(), "bench", "loader", "--data", "/usr/share/datasets/fashion-mnist",
                              "--threads", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(j["images"], 60000);
}

}  // namespace
}  // namespace crucible
