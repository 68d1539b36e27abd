// Every command honours --set (issue 46): a key given with --set wins over a command's own
// defaults, an option given explicitly that a --set contradicts is refused (exit 2, naming both),
// and every [data] key is accepted where [data] is read.
// - `crucible bench loader` walks EVERY [data] key, enumerated from the job's schema: each is set
//   to a valid non-default value and its arrival is observed — the batch shape, the thread count,
//   the prefetch depth, the sample count, the digest (pixels, labels or order changed), the
//   pipeline's own description — or, for a key a loader run cannot apply, the run names it in
//   `not_applied` and warns once; every run echoes the effective value in `settings`;
// - preview, doctor, eval and predict read a --set data key over their own choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "crucible/core/config.h"
#include "crucible/train/job_config.h"
#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;

// Every key a job's [data] section holds, as the job's schema lists it (the data layer's and the
// train pieces' that sit in [data]).
std::vector<std::string> data_keys() {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  std::vector<std::string> keys;
  for (const ConfigKey* k : schema.keys()) {
    if (k->section() == "data") keys.push_back(k->full_name());
  }
  return keys;
}

// The fixtures: `photos`, 264 textured JPEGs of 40–110 px in 4 classes (one of them turned by
// its EXIF orientation tag); `bad`, 8 JPEGs and a corrupt one; `packed`, the photos in ~20
// shards; arrays a (40 samples), b (24), each with its labels and a permutation of them.
void make_fixtures(const test::TempDir& d) {
  test::run_python(R"PY(import numpy as np, os, sys
from PIL import Image
root = ')PY" + d.path() + R"PY('
rng = np.random.default_rng(7)
def photo(path, w, h, exif=None):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], -1)
    a = (base + rng.integers(0, 64, (h, w, 3))).clip(0, 255).astype(np.uint8)
    im = Image.fromarray(a)
    if exif is None:
        im.save(path, quality=92)
    else:
        e = Image.Exif(); e[0x0112] = exif
        im.save(path, quality=92, exif=e.tobytes())
for i in range(264):
    d = os.path.join(root, 'photos', 'class%d' % (i % 4)); os.makedirs(d, exist_ok=True)
    photo(os.path.join(d, '%04d.jpg' % i), int(rng.integers(40, 110)), int(rng.integers(40, 110)),
          exif=6 if i == 0 else None)
for i in range(8):
    d = os.path.join(root, 'bad', 'class%d' % (i % 2)); os.makedirs(d, exist_ok=True)
    photo(os.path.join(d, '%04d.jpg' % i), 48, 48)
b = open(os.path.join(root, 'bad', 'class1', '0001.jpg'), 'rb').read()
open(os.path.join(root, 'bad', 'class1', 'broken.jpg'), 'wb').write(b[:200] + b'\x00' * 300 + b[500:])
for name, n in (('a', 40), ('b', 24)):
    np.save(os.path.join(root, name + '.npy'), rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8))
    y = rng.integers(0, 4, n).astype(np.int64)
    np.save(os.path.join(root, name + '_y.npy'), y)
    np.save(os.path.join(root, name + '_y2.npy'), np.roll(y, 1) ^ 1)
)PY");
  const auto r = test::run_command({test::crucible_binary(), "pack", d / "photos", d / "packed", "--shard-mb", "0.05"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// The last line of `out` that is a JSON object (--json prints it last).
json last_json(const std::string& out) {
  const auto at = out.rfind("\n{");
  return json::parse(out.substr(at == std::string::npos ? 0 : at + 1));
}

struct BenchRun {
  int code = -1;
  json j;  // the --json line (null when the run failed)
  std::string err;
};

BenchRun bench(const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {test::crucible_binary(), "bench", "loader", "--batch-size", "32", "--epochs", "1",
                                  "--warmup", "0", "--digest", "--json"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const auto r = test::run_command(cmd);
  BenchRun out{r.exit_code, nullptr, r.err};
  if (r.exit_code == 0) out.j = last_json(r.out);
  return out;
}

// A --set value (TOML text) as the JSON the settings echo holds: numbers, booleans and arrays
// parse as JSON; bare words are strings.
json as_json(const std::string& toml) {
  try {
    return json::parse(toml);
  } catch (const json::parse_error&) {
    return toml;
  }
}

// How a key's arrival shows in a bench loader run (Walk::how).
enum class How {
  kShape,          // the batches' samples are `number` pixels square
  kImages,         // `number` images were loaded
  kThreads,        // the loader ran `number` threads
  kPrefetch,       // the loader prepared `number` batches ahead
  kDigestChanges,  // pixels, labels or order differ from the run of `base` alone
  kDigestEquals,   // the batches equal those of the run of `same_as` (the key names that data)
  kDescribes,      // the pipeline's description holds `text`
  kSkips,          // a bad sample was skipped (the run of `base` alone fails on it)
  kNotApplied,     // a loader run cannot apply it: named in not_applied, warned once
};

struct Walk {
  Walk() = default;
  Walk(std::string value, std::vector<std::string> base, How how, int64_t number = 0, std::string text = "",
       std::vector<std::string> same_as = {})
      : value(std::move(value)), base(std::move(base)), how(how), number(number), text(std::move(text)),
        same_as(std::move(same_as)) {}
  std::string value;              // valid, not the default (TOML text, as --set takes it)
  std::vector<std::string> base;  // the run without the key
  How how = How::kNotApplied;
  int64_t number = 0;
  std::string text;
  std::vector<std::string> same_as;
};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The walk of every [data] key: a value and how it shows. A key the schema gains needs an entry
// here (the test fails naming it), so no key goes unwalked.
std::map<std::string, Walk> walks(const test::TempDir& d) {
  const std::vector<std::string> photos = {"--data", d / "photos", "--set", "data.crop=32", "--set", "data.threads=2"};
  const std::vector<std::string> eval = plus(photos, {"--eval"});
  const std::vector<std::string> arrays = {"--set", "data.dataset=arrays", "--set", "data.threads=2"};
  const std::vector<std::string> a = {"--set", "data.train_images=" + (d / "a.npy"), "--set",
                                      "data.train_labels=" + (d / "a_y.npy")};
  const std::vector<std::string> b = {"--set", "data.test_images=" + (d / "b.npy"), "--set",
                                      "data.test_labels=" + (d / "b_y.npy")};
  const std::vector<std::string> images = {"--set", "data.dataset=images", "--set", "data.crop=32", "--set",
                                           "data.threads=2"};
  auto with = [&](std::vector<std::string> base, const std::string& set) { return plus(base, {"--set", set}); };
  const auto randaugment = with(photos, "data.augment=randaugment");
  const auto augmix = with(photos, "data.augment=augmix");
  std::map<std::string, Walk> w;
  // Where the data come from (no --data: the [data] section names them, as for training).
  w["data.dataset"] = {"arrays", plus({"--set", "data.threads=2"}, plus(a, b)), How::kImages, 40};
  w["data.train_images"] = {d / "a.npy", plus(arrays, plus({"--set", "data.train_labels=" + (d / "a_y.npy")}, b)),
                            How::kImages, 40};
  w["data.train_labels"] = {d / "a_y2.npy", plus(arrays, plus(a, b)), How::kDigestChanges};
  w["data.test_images"] = {d / "b.npy", plus(arrays, {"--eval", "--set", "data.test_labels=" + (d / "b_y.npy")}),
                           How::kImages, 24};
  w["data.test_labels"] = {d / "b_y2.npy", plus(arrays, plus({"--eval"}, b)), How::kDigestChanges};
  w["data.train_path"] = {d / "photos", images, How::kDigestEquals, 0, "", photos};
  w["data.test_path"] = {d / "photos", plus(images, {"--eval"}), How::kDigestEquals, 0, "", eval};
  // The image pipeline.
  w["data.crop"] = {"48", photos, How::kShape, 48};
  w["data.eval_crop"] = {"40", eval, How::kShape, 40};
  w["data.eval_resize"] = {"64", eval, How::kDigestChanges};
  w["data.cache"] = {"decoded", photos, How::kDescribes, 0, "cache decoded"};
  w["data.cache_mb"] = {"3", with(photos, "data.cache=encoded"), How::kDescribes, 0, "budget 3 MiB"};
  w["data.jpeg_decode"] = {"accurate", photos, How::kDigestChanges};
  w["data.jpeg_dct_scaling"] = {"false", photos, How::kDigestChanges};
  w["data.exif_orientation"] = {"false", photos, How::kDigestChanges};
  w["data.color_order"] = {"BGR", photos, How::kDigestChanges};
  w["data.bad_samples"] = {"skip", {"--data", d / "bad", "--set", "data.crop=32", "--set", "data.threads=2"},
                           How::kSkips};
  w["data.train_samples"] = {"100", photos, How::kImages, 100};
  w["data.test_samples"] = {"50", eval, How::kImages, 50};
  w["data.sampler"] = {"global", photos, How::kDigestChanges};
  w["data.threads"] = {"3", photos, How::kThreads, 3};
  w["data.prefetch"] = {"2", photos, How::kPrefetch, 2};
  // Normalisation: on the device, after the loader (DeviceInput).
  w["data.mean"] = {"[0.5, 0.5, 0.5]", photos, How::kNotApplied};
  w["data.std"] = {"[0.2, 0.2, 0.2]", photos, How::kNotApplied};
  w["data.mean_std_range"] = {"byte", photos, How::kNotApplied};
  w["data.mean_std_order"] = {"BGR", photos, How::kNotApplied};
  // Remote data only (the photos are local): tests/scripts/remote_data_test.py walks them.
  w["data.cache_dir"] = {d / "cache", photos, How::kNotApplied};
  w["data.cache_bytes"] = {"1048576", photos, How::kNotApplied};
  w["data.s3_endpoint"] = {"http://127.0.0.1:9", photos, How::kNotApplied};
  w["data.s3_region"] = {"eu-west-1", photos, How::kNotApplied};
  w["data.ca_bundle"] = {d / "ca.pem", photos, How::kNotApplied};
  w["data.remote_tries"] = {"2", photos, How::kNotApplied};
  w["data.remote_timeout"] = {"5.5", photos, How::kNotApplied};
  w["data.io_threads"] = {"2", photos, How::kNotApplied};
  w["data.remote_part_bytes"] = {"65536", photos, How::kNotApplied};
  // The data pieces: sample transforms and samplers.
  w["data.hflip"] = {"0", photos, How::kDigestChanges};
  w["data.shuffle_window"] = {"1", {"--data", d / "packed", "--set", "data.crop=32", "--set", "data.threads=2",
                                    "--set", "data.sampler=global"},
                              How::kDigestChanges};
  w["data.repeats"] = {"2", with(photos, "data.sampler=repeated"), How::kDigestChanges};
  w["data.solarize"] = {"0.5", photos, How::kDigestChanges};
  w["data.solarize_threshold"] = {"64", with(photos, "data.solarize=1"), How::kDigestChanges};
  w["data.augment"] = {"trivialaugment_wide", photos, How::kDigestChanges};
  w["data.augment_num_ops"] = {"1", randaugment, How::kDigestChanges};
  w["data.augment_magnitude"] = {"3", randaugment, How::kDigestChanges};
  w["data.augment_bins"] = {"11", randaugment, How::kDigestChanges};
  w["data.augment_policy"] = {"svhn", with(photos, "data.augment=autoaugment"), How::kDigestChanges};
  w["data.augment_interpolation"] = {"bilinear", randaugment, How::kDigestChanges};
  w["data.augment_fill"] = {"[128]", randaugment, How::kDigestChanges};
  w["data.augmix_severity"] = {"1", augmix, How::kDigestChanges};
  w["data.augmix_width"] = {"2", augmix, How::kDigestChanges};
  w["data.augmix_depth"] = {"2", augmix, How::kDigestChanges};
  w["data.augmix_alpha"] = {"0.5", augmix, How::kDigestChanges};
  w["data.augmix_all_ops"] = {"false", augmix, How::kDigestChanges};
  // The train pieces in [data]: batch transforms on the device, after the loader.
  w["data.random_erase"] = {"0.25", photos, How::kNotApplied};
  w["data.random_erase_scale"] = {"[0.1, 0.2]", photos, How::kNotApplied};
  w["data.random_erase_ratio"] = {"[0.5, 2.0]", photos, How::kNotApplied};
  w["data.random_erase_value"] = {"[0.5]", photos, How::kNotApplied};
  w["data.mixup_alpha"] = {"0.2", photos, How::kNotApplied};
  w["data.cutmix_alpha"] = {"1.0", photos, How::kNotApplied};
  // Detection data's keys, which a classification run names not applied (their values are the
  // defaults; tests/python/test_detection_data.py walks them on a detection set).
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"data.detection_preset", "hflip"}, {"data.bad_boxes", "clamp"}, {"data.max_boxes", "10000"},
           {"data.images_root", d / "images"}, {"data.test_images_root", d / "images"}, {"data.size_divisible", "32"},
           {"data.aspect_ratio_group_factor", "3"}, {"data.detection_fill", "[123, 117, 104]"},
           {"data.lsj_size", "1024"}, {"data.yolox_size", "640"}, {"data.yolox_mosaic_epochs", "284"},
           {"data.yolox_mosaic_prob", "1.0"}, {"data.yolox_mixup", "true"}, {"data.yolox_mixup_prob", "1.0"},
           {"data.yolox_hsv_prob", "1.0"}, {"data.yolox_degrees", "10.0"}, {"data.yolox_translate", "0.1"},
           {"data.yolox_mosaic_scale", "[0.1, 2.0]"}, {"data.yolox_mixup_scale", "[0.5, 1.5]"},
           {"data.yolox_shear", "2.0"}, {"data.yolox_max_labels", "120"}}) {
    w[key] = {value, photos, How::kNotApplied};
  }
  return w;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(SettingsCli, BenchLoaderWalksEveryDataKeyAndEachArrives) {
  test::TempDir d;
  make_fixtures(d);
  const std::map<std::string, Walk> table = walks(d);
  const std::vector<std::string> keys = data_keys();
  ASSERT_GT(keys.size(), 50u);
  std::vector<std::string> unwalked, stale;
  for (const auto& k : keys) {
    if (table.count(k) == 0) unwalked.push_back(k);
  }
  for (const auto& [k, _] : table) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) stale.push_back(k);
  }
  EXPECT_TRUE(unwalked.empty()) << "[data] keys this walk has no entry for (give each in walks(): a valid "
                                   "non-default value and how its arrival shows): "
                                << joined(unwalked);
  EXPECT_TRUE(stale.empty()) << "walks() names keys the schema no longer has: " << joined(stale);

  std::map<std::string, BenchRun> runs;  // by arguments: the baselines, run once each
  auto run = [&](const std::vector<std::string>& args) -> const BenchRun& {
    const std::string id = joined(args);
    auto it = runs.find(id);
    if (it == runs.end()) it = runs.emplace(id, bench(args)).first;
    return it->second;
  };
  std::vector<std::string> failed;
  for (const auto& key : keys) {
    const auto found = table.find(key);
    if (found == table.end()) continue;
    const Walk& w = found->second;
    SCOPED_TRACE(key + "=" + w.value);
    const int before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    const BenchRun r = bench(plus(w.base, {"--set", key + "=" + w.value}));
    EXPECT_EQ(r.code, 0) << r.err;
    if (r.code == 0) {
      // The effective value, echoed.
      EXPECT_TRUE(r.j.contains("settings") && r.j["settings"].contains(key) && r.j["settings"][key] == as_json(w.value))
          << "settings echo: " << (r.j.contains("settings") ? r.j["settings"].dump() : std::string("(none)"));
      const bool named = r.j.contains("not_applied") && r.j["not_applied"].contains(key);
      EXPECT_EQ(named, w.how == How::kNotApplied) << "not_applied: " << r.j.value("not_applied", json()).dump();
      switch (w.how) {
        case How::kShape: {
          const json shape = r.j.value("sample_shape", json());
          EXPECT_EQ(shape, json::array({3, w.number, w.number})) << r.j.dump();
          break;
        }
        case How::kImages:
          EXPECT_EQ(r.j["images"], w.number);
          break;
        case How::kThreads:
          EXPECT_EQ(r.j["threads"], w.number);
          break;
        case How::kPrefetch:
          EXPECT_EQ(r.j.value("prefetch", json()), w.number) << r.j.dump();
          break;
        case How::kDigestChanges: {
          const BenchRun& base = run(w.base);
          ASSERT_EQ(base.code, 0) << joined(w.base) << "\n" << base.err;
          EXPECT_NE(r.j["digest"], base.j["digest"]) << "the batches did not change";
          break;
        }
        case How::kDigestEquals: {
          const BenchRun& same = run(w.same_as);
          ASSERT_EQ(same.code, 0) << same.err;
          EXPECT_EQ(r.j["digest"], same.j["digest"]) << "not the batches of " << joined(w.same_as);
          break;
        }
        case How::kDescribes:
          expect_contains(r.j.value("pipeline", std::string()) + "\n" + r.err, w.text);
          break;
        case How::kSkips:
          EXPECT_NE(run(w.base).code, 0) << "the bad sample must stop the run without the key";
          EXPECT_EQ(r.j["skipped"], 1);
          break;
        case How::kNotApplied:
          EXPECT_EQ(count(r.err, key + " = "), 1u) << "one warning naming the key:\n" << r.err;
          expect_contains(r.err, "not applied");
          break;
      }
    }
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() != before) {
      failed.push_back(key);
    }
  }
  EXPECT_TRUE(failed.empty()) << failed.size() << " of " << keys.size() << " [data] keys did not arrive: "
                              << joined(failed);
}

TEST(SettingsCli, BenchLoaderSourceKeysBesideDataAreRefusedNamingBoth) {
  test::TempDir d;
  make_fixtures(d);
  for (const std::string key : {"data.dataset=arrays", "data.train_path=/elsewhere", "data.train_images=x.npy"}) {
    const BenchRun r = bench({"--data", d / "photos", "--set", key});
    EXPECT_EQ(r.code, 2) << key << "\n" << r.err;
    expect_contains(r.err, "--data");
    expect_contains(r.err, key.substr(0, key.find('=')));
  }
  // The same path twice is no conflict.
  EXPECT_EQ(bench({"--data", d / "photos", "--set", "data.train_path=" + (d / "photos"), "--set", "data.crop=32"}).code,
            0);
}

TEST(SettingsCli, BenchLoaderSetWinsOverDefaultsAndAnOptionItContradictsIsRefused) {
  test::TempDir d;
  make_fixtures(d);
  // Issue 46's acceptance: 128-pixel batches.
  const BenchRun set = bench({"--data", d / "photos", "--set", "data.crop=128", "--set", "data.train_samples=64"});
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_EQ(set.j.value("sample_shape", json()), json::array({3, 128, 128})) << set.j.dump();
  EXPECT_EQ(set.j["crop"], 128);
  // The option alone, and both agreeing.
  const BenchRun option = bench({"--data", d / "photos", "--crop", "96", "--threads", "2", "--set", "data.train_samples=64"});
  ASSERT_EQ(option.code, 0) << option.err;
  EXPECT_EQ(option.j.value("sample_shape", json()), json::array({3, 96, 96}));
  EXPECT_EQ(option.j["threads"], 2);
  EXPECT_EQ(bench({"--data", d / "photos", "--crop", "96", "--set", "data.crop=96", "--set", "data.train_samples=64"})
                .code,
            0);
  // Disagreeing: refused, naming both.
  for (const auto& [option_args, set_arg] :
       {std::pair<std::vector<std::string>, std::string>{{"--crop", "96"}, "data.crop=128"},
        {{"--threads", "2"}, "data.threads=3"}}) {
    const BenchRun r = bench(plus({"--data", d / "photos", "--set", set_arg}, option_args));
    EXPECT_EQ(r.code, 2) << r.err;
    expect_contains(r.err, option_args[0] + " " + option_args[1]);
    expect_contains(r.err, set_arg);
  }
  // A key of another section is refused by name, saying what bench loader reads.
  const BenchRun other = bench({"--data", d / "photos", "--set", "train.multi_scale=[32]"});
  EXPECT_EQ(other.code, 2);
  expect_contains(other.err, "train.multi_scale");
  expect_contains(other.err, "[data]");
}

TEST(SettingsCli, BenchLoaderEvalNamesTheTrainingKeysItDoesNotApply) {
  test::TempDir d;
  make_fixtures(d);
  const std::vector<std::string> eval = {"--data", d / "photos", "--eval", "--set", "data.crop=32", "--set",
                                         "data.threads=2"};
  const BenchRun plain = bench(eval);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const BenchRun r = bench(plus(eval, {"--set", "data.hflip=0", "--set", "data.augment=randaugment", "--set",
                                  "data.train_samples=10"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j["digest"], plain.j["digest"]);  // truly not applied
  for (const char* key : {"data.hflip", "data.augment", "data.train_samples"}) {
    EXPECT_TRUE(r.j["not_applied"].contains(key)) << key << ": " << r.j["not_applied"].dump();
    EXPECT_EQ(count(r.err, std::string(key) + " = "), 1u) << r.err;
  }
}

// The torch commands read the job ([data] of the built-in job or a file) with the --set keys over
// it: an images job over the photos whose keys each command reads in its own way.
std::vector<std::string> job(const test::TempDir& d, const std::string& name) {
  return {"--set", "run.dir=" + d.path(), "--set", "run.name=" + name, "--set", "data.dataset=images",
          "--set", "data.train_path=" + (d / "photos"), "--set", "data.test_path=" + (d / "photos"),
          "--set", "data.mean=[0.5,0.5,0.5]", "--set", "data.std=[0.25,0.25,0.25]", "--set", "data.threads=2",
          "--set", "train.batch_size=8", "--set", "train.eval_batch_size=32", "--set", "train.precision=fp32"};
}

test::CommandResult crucible_run(const std::vector<std::string>& head, const std::vector<std::string>& tail) {
  std::vector<std::string> cmd = {test::crucible_binary()};
  cmd.insert(cmd.end(), head.begin(), head.end());
  cmd.insert(cmd.end(), tail.begin(), tail.end());
  return test::run_command(cmd);
}

// preview: the tiles take --set data.crop (the built-in job's is 224) and the batch transforms
// of a --set train piece in [data]; train.multi_scale, which preview does not apply (the tiles
// keep the crop's size), is said, not dropped silently.
TEST(SettingsCli, PreviewTakesSetDataKeysAndNamesMultiScaleItDoesNotApply) {
  test::TempDir d;
  make_fixtures(d);
  auto preview = [&](const std::string& out, const std::vector<std::string>& extra) {
    return crucible_run(plus({"preview", "--n", "8", "--json", "--out", d / out, "--set", "data.hflip=0"}, job(d, "p")),
                        extra);
  };
  const auto plain = preview("plain.png", {"--set", "data.crop=40"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const json p = last_json(plain.out);
  EXPECT_EQ(p["width"], 3 * (40 + 2) + 2);  // 3 columns of 40-pixel tiles and 2-pixel gaps
  const auto erased = preview("erased.png", {"--set", "data.crop=40", "--set", "data.random_erase=1"});
  ASSERT_EQ(erased.exit_code, 0) << erased.err;
  EXPECT_NE(test::read_text(d / "erased.png"), test::read_text(d / "plain.png"));
  const auto scaled = preview("scaled.png", {"--set", "data.crop=40", "--set", "train.multi_scale=[24,32]"});
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  const json s = last_json(scaled.out);
  EXPECT_EQ(s["width"], p["width"]);
  EXPECT_EQ(test::read_text(d / "scaled.png"), test::read_text(d / "plain.png"));
  ASSERT_TRUE(s.contains("not_applied")) << s.dump();
  EXPECT_TRUE(s["not_applied"].contains("train.multi_scale")) << s.dump();
  EXPECT_EQ(count(scaled.err, "train.multi_scale = "), 1u) << scaled.err;
}

// doctor: the loader's threads and the training samples are the --set ones.
TEST(SettingsCli, DoctorChecksTheSetThreadsAndSamples) {
  test::TempDir d;
  make_fixtures(d);
  const auto r = crucible_run(plus({"doctor", "--json"}, job(d, "doc")),
                              {"--set", "data.threads=3", "--set", "data.train_samples=100", "--set", "data.crop=32"});
  const json j = last_json(r.out);
  std::map<std::string, std::string> found;
  for (const auto& c : j["checks"]) found[c["name"].get<std::string>()] = c["found"].get<std::string>();
  expect_contains(found["open_files"], "3 reader thread(s)");
  expect_contains(found["data"], "100 training samples");
}

// eval and predict: the test samples and the crop are the --set ones (the run trained on 32-pixel
// crops of the photos; evaluating at the built-in 224 would not fit its model's input).
TEST(SettingsCli, EvalAndPredictReadTheSetTestSamples) {
  test::TempDir d;
  make_fixtures(d);
  const auto t = crucible_run(plus({"train"}, job(d, "r")), {"--set", "data.crop=32", "--set", "train.epochs=1",
                                                             "--set", "train.max_steps=2", "--set", "data.test_samples=16"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const auto e = crucible_run(plus({"eval", "--json"}, job(d, "r")), {"--set", "data.crop=32", "--set", "data.test_samples=40"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  expect_contains(e.out, "40 test samples");
  const auto p = crucible_run(plus({"predict", "--out", d / "p.jsonl"}, job(d, "r")),
                              {"--set", "data.crop=32", "--set", "data.test_samples=44"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(count(test::read_text(d / "p.jsonl"), "\n"), 44u);
}

// bench model: --batch and a --set train.batch_size that disagrees are refused; the --set alone
// is the batch timed.
TEST(SettingsCli, BenchModelBatchAndADisagreeingSetAreRefused) {
  const std::vector<std::string> quick = {"bench", "model", "--json", "--job-precision", "--warmup", "0", "--repeats",
                                          "3", "--seconds", "1"};
  const auto set = crucible_run(quick, {"--set", "train.batch_size=8"});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_EQ(last_json(set.out)["batch"], 8);
  const auto both = crucible_run(quick, {"--batch", "4", "--set", "train.batch_size=8"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
  expect_contains(both.err, "--batch 4");
  expect_contains(both.err, "train.batch_size=8");
}

}  // namespace
}  // namespace crucible
