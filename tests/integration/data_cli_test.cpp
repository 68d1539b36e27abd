// `crucible bench loader` and `crucible pack` end to end: the digest is identical for 1, 2
// and 4 threads and across a mid-epoch save/restore; a folder with a corrupt JPEG and a
// truncated PNG finishes under "skip" naming both, and stops under "fail" naming the first
// (D5); packed shards give the same batches as the folder they came from.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;

using test::expect_contains;

void make_photos(const std::string& root, int n, bool with_bad, int max_side = 200) {
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(1)\n"
                   "for i in range(" + std::to_string(n) + "):\n"
                   "    d = os.path.join('" + root + "', 'class%d' % (i % 4)); os.makedirs(d, exist_ok=True)\n"
                   "    a = rng.integers(0, 256, (int(rng.integers(60, " + std::to_string(max_side) + ")), int(rng.integers(60, " +
                   std::to_string(max_side) + ")), 3), dtype=np.uint8)\n"
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
  return json::parse(r.out.substr(r.out.rfind("\n{") + 1));
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
  const json j = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_EQ(j["images"], 60000);
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// D11: summary.json counts each split's reads exactly (files, the bytes of those files, the RAM
// cache's hits and misses), its rates agree with its counts and serving time, the report shows
// them, and `crucible doctor` measures one reader and predicts the cache's hit rate.
TEST(DataCli, EachSplitsReadsAndCacheHitsAreCountedD11) {
  test::TempDir d;
  make_photos(d / "train", 48, false);
  make_photos(d / "test", 16, false);
  auto bytes_of = [](const std::string& dir) {
    int64_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
    }
    return total;
  };
  int64_t train_bytes = bytes_of(d / "train");
  const int64_t test_bytes = bytes_of(d / "test");
  auto job = [&](const std::string& name, std::initializer_list<std::string> extra) {
    std::vector<std::string> cmd = {"--set", "run.dir=" + d.path(), "--set", "run.name=" + name,
                                    "--set", "data.dataset=images", "--set", "data.train_path=" + (d / "train"),
                                    "--set", "data.test_path=" + (d / "test"), "--set", "data.crop=32",
                                    "--set", "data.mean=[0.5,0.5,0.5]", "--set", "data.std=[0.25,0.25,0.25]",
                                    "--set", "data.threads=2", "--set", "train.epochs=2",
                                    "--set", "train.batch_size=16", "--set", "train.eval_batch_size=16",
                                    "--set", "train.precision=fp32"};  // no trial batch read before the run
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return cmd;
  };
  auto train = [&](const std::string& name, std::initializer_list<std::string> extra) {
    std::vector<std::string> cmd = {test::crucible_binary(), "train"};
    for (const auto& a : job(name, extra)) cmd.push_back(a);
    const auto r = test::run_command(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(test::read_text(d / (name + "/summary.json")))["io"];
  };
  // Two epochs through an encoded cache that holds everything: every file is read once, then hit.
  const json cached = train("cached", {"--set", "data.cache=encoded", "--set", "data.cache_mb=64"});
  for (const auto& [split, files, bytes] :
       {std::tuple{"train", 48, train_bytes}, std::tuple{"test", 16, test_bytes}}) {
    const json& s = cached[split];
    EXPECT_EQ(s["files"], files) << s.dump(1);
    EXPECT_EQ(s["bytes"], bytes) << s.dump(1);
    EXPECT_EQ(s["cache"]["mode"], "encoded");
    EXPECT_EQ(s["cache"]["hits"], files) << s.dump(1);
    EXPECT_EQ(s["cache"]["misses"], files) << s.dump(1);
    EXPECT_DOUBLE_EQ(s["cache"]["hit_rate"].get<double>(), 0.5);
    EXPECT_GT(s["cache"]["held_bytes"].get<int64_t>(), bytes);  // the bytes and each entry's bookkeeping
    EXPECT_GT(s["seconds"].get<double>(), 0);
    EXPECT_NEAR(s["files_per_s"].get<double>() * s["seconds"].get<double>(), files, 1e-6 * files);
    EXPECT_NEAR(s["bytes_per_s"].get<double>() * s["seconds"].get<double>(), static_cast<double>(bytes),
                1e-6 * static_cast<double>(bytes));
    EXPECT_GT(s["ms_per_file"].get<double>(), 0);
  }
  // Without the cache every epoch reads every file again (and evaluation too, after each epoch).
  const json plain = train("plain", {});
  EXPECT_EQ(plain["train"]["files"], 2 * 48);
  EXPECT_EQ(plain["train"]["bytes"], 2 * train_bytes);
  EXPECT_EQ(plain["test"]["files"], 2 * 16);
  EXPECT_TRUE(plain["train"]["cache"].is_null());
  // The report's table.
  const std::string html = test::read_text(d / "cached/report.html");
  expect_contains(html, {"Reading the data", "encoded: 50.0% hits (48 of 96)", "encoded: 50.0% hits (16 of 32)"});
  // doctor: one reader's figures, and what a 1 MiB budget holds of each split: all of the 16 test
  // files, part of a training split of larger photos.
  make_photos(d / "big", 48, false, 400);
  train_bytes = bytes_of(d / "big");
  ASSERT_GT(train_bytes, 2 << 20);
  std::vector<std::string> cmd = {test::crucible_binary(), "doctor", "--json"};
  for (const auto& a : job("doc", {"--set", "data.cache=encoded", "--set", "data.cache_mb=1", "--set",
                                   "data.train_path=" + (d / "big")})) {
    cmd.push_back(a);
  }
  const auto r = test::run_command(cmd);
  const json checks = json::parse(r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1));
  int seen = 0;
  for (const auto& c : checks["checks"]) {
    if (c["name"] != "io_train" && c["name"] != "io_test") continue;
    ++seen;
    const json& f = c["figures"];
    const bool train_split = c["name"] == "io_train";
    EXPECT_EQ(f["size"], train_split ? 48 : 16);
    ASSERT_GT(f["files"].get<int64_t>(), 0) << c.dump(1);
    if (f["files"] == f["size"]) {
      EXPECT_EQ(f["bytes"], train_split ? train_bytes : test_bytes) << c.dump(1);
    }
    EXPECT_NEAR(f["files_per_s"].get<double>() * f["seconds"].get<double>(), f["files"].get<double>(), 1e-6 * 48);
    // The cache needs about the split's bytes; 1 MiB of them is the expected hit rate.
    const double needed = f["cache"]["needed_bytes"].get<double>();
    const double split_bytes = static_cast<double>(train_split ? train_bytes : test_bytes);
    EXPECT_GT(needed, split_bytes);
    EXPECT_LT(needed, 1.1 * split_bytes);
    EXPECT_NEAR(f["cache"]["expected_hit_rate"].get<double>(), std::min(1.0, (1 << 20) / needed), 1e-9);
    if (train_split) {
      EXPECT_LT(f["cache"]["expected_hit_rate"].get<double>(), 0.5) << c.dump(1);
      EXPECT_EQ(c["status"], "warn") << c.dump(1);
      expect_contains(c["fix"].get<std::string>(),
                      "raise data.cache_mb to " + std::to_string(static_cast<int64_t>(needed / (1 << 20)) + 1));
    } else {
      EXPECT_EQ(f["cache"]["expected_hit_rate"].get<double>(), 1.0) << c.dump(1);
      EXPECT_EQ(c["status"], "ok") << c.dump(1);
    }
  }
  EXPECT_EQ(seen, 2) << r.out << r.err;
}

}  // namespace
}  // namespace crucible
