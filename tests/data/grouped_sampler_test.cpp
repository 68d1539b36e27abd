// Batches grouped by aspect ratio (grouped_sampler.h) through the loader, on a COCO set of varied
// aspect ratios: every batch holds one group; the batches are the same for any thread count and
// a loader started mid-epoch gives the uninterrupted epoch's batches from there, bit for bit
// (law 1); the global order keeps a step's samples at any world size; the factor -1 and a
// pipeline without image sizes leave the sampler's order alone. The comparison with torchvision's
// GroupedBatchSampler itself is tests/python/test_detection_grouping.py.
#include "crucible/data/samplers/grouped_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "crucible/core/sha256.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/loader/detection_pipeline.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/transforms/detection_presets.h"
#include "test_util.h"

namespace crucible::data {
namespace {

using json = nlohmann::json;

// A COCO set of `n` JPEGs beside its JSON, image i of the i % 8-th size: one in each of factor 3's
// eight groups (bins 1/2 … 2), from a sliver to a panorama, so that every group fills batches and
// is left over at the end of some epoch; a box or two each.
std::string write_coco(const test::TempDir& dir, int n) {
  const std::vector<std::pair<int, int>> shapes = {{20, 44}, {30, 54}, {32, 48}, {36, 40},
                                                   {40, 40}, {48, 32}, {56, 32}, {64, 16}};
  std::mt19937 gen(3);
  json j = {{"images", json::array()}, {"annotations", json::array()},
            {"categories", json::array({{{"id", 1}, {"name", "thing"}}})}};
  for (int i = 0; i < n; ++i) {
    const auto [w, h] = shapes[static_cast<size_t>(i) % shapes.size()];
    std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
    for (auto& v : rgb) v = static_cast<uint8_t>(gen());
    const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), w, h, 90);
    const std::string name = "img" + std::to_string(i) + ".jpg";
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
    j["images"].push_back({{"id", 10 + i}, {"file_name", name}, {"width", w}, {"height", h}});
    for (int k = 0; k <= i % 2; ++k) {
      const std::vector<double> bbox = {1.0 + k, 2.0, w / 3.0, h / 4.0};
      j["annotations"].push_back({{"id", 100 * i + k}, {"image_id", 10 + i}, {"category_id", 1}, {"bbox", bbox},
                                  {"iscrowd", 0}, {"area", bbox[2] * bbox[3]}});
    }
  }
  const std::string path = dir / "instances.json";
  std::ofstream(path) << j.dump();
  return path;
}

std::shared_ptr<const DetectionPipeline> coco_pipeline(const test::TempDir& dir, int n) {
  DetectionPipelineOptions o;
  o.preset = "test";
  o.transforms = {std::make_shared<DetectionHorizontalFlip>(0.5), std::make_shared<SanitizeBoundingBoxes>()};
  o.augment_seed = 1234;
  return std::make_shared<DetectionPipeline>(open_samples(write_coco(dir, n)), o);
}

// The training sampler data.sampler gives, with the pipeline's aspect ratios, as training builds it.
std::shared_ptr<const Sampler> training_sampler(const SamplePipeline& pipeline, int64_t batch,
                                                const std::string& sampler = "distributed", Sampler::Shard shard = {},
                                                int64_t factor = 3) {
  DataConfig config;
  config.sampler = sampler;
  config.pieces.of<DetectionSettings>(kDetectionPiece).aspect_ratio_group_factor = factor;
  SamplerBuild build(pipeline.size(), 99, shard);
  build.batch = batch;
  build.aspect_ratios = aspect_ratios_of(pipeline);
  return make_training_sampler(config, build);
}

// Every field of a detection batch, for equality (as a digest: a failure prints it short).
std::string fingerprint(const Batch& b) {
  std::string s(reinterpret_cast<const char*>(b.pixels.data()), b.pixels.size());
  auto add = [&](const auto& v) { s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])); };
  add(b.sample_ids), add(b.copies), add(b.image_sizes), add(b.image_ids), add(b.boxes), add(b.box_labels),
      add(b.box_crowd), add(b.box_offsets);
  return sha256_hex(s + std::to_string(b.spec.height) + "x" + std::to_string(b.spec.width)).substr(0, 16);
}

struct Epoch {
  std::vector<std::string> fingerprints;
  std::vector<std::vector<int64_t>> samples;
};

Epoch epoch_batches(const std::shared_ptr<const SamplePipeline>& pipeline, std::shared_ptr<const Sampler> sampler,
                    int64_t batch, int threads, int64_t epoch, int64_t first) {
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = threads;
  Loader loader(pipeline, std::move(sampler), o);
  loader.start_epoch(epoch, first);
  Epoch out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(b->detection);
    out.fingerprints.push_back(fingerprint(*b));
    out.samples.push_back(b->sample_ids);
  }
  return out;
}

TEST(GroupedBatches, OneGroupPerBatchAnyThreadCountAndResumedMidEpochBitExact) {
  test::TempDir dir;
  const auto pipeline = coco_pipeline(dir, 29);
  const int64_t batch = 3;
  const auto sampler = training_sampler(*pipeline, batch);
  const auto* grouped = dynamic_cast<const GroupedBatchSampler*>(sampler.get());
  ASSERT_NE(grouped, nullptr) << sampler->describe();
  EXPECT_NE(sampler->describe().find("grouped by aspect ratio into 8 groups (factor 3)"), std::string::npos)
      << sampler->describe();
  const std::vector<int64_t>& groups = grouped->group_ids();
  for (int64_t i = 0; i < 29; ++i) ASSERT_EQ(groups[i], i % 8) << i;
  const Epoch one = epoch_batches(pipeline, sampler, batch, 1, 1, 0);
  ASSERT_EQ(one.samples.size(), 29u / batch);  // every batch full: 9, none partial (8 of one group, 1 topped up)
  for (const auto& samples : one.samples) {
    ASSERT_EQ(samples.size(), static_cast<size_t>(batch));
    for (const int64_t i : samples) EXPECT_EQ(groups[i], groups[samples[0]]) << "a batch mixes groups";
  }
  for (int64_t epoch = 0; epoch < 50; ++epoch) {  // the top-ups of more epochs: each from its own group
    const std::vector<int64_t> order = sampler->epoch_order(epoch);
    ASSERT_EQ(order.size(), 27u);
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(groups[order[i]], groups[order[i - i % batch]]) << "epoch " << epoch << ": a batch mixes groups";
    }
  }
  EXPECT_EQ(epoch_batches(pipeline, sampler, batch, 4, 1, 0).fingerprints, one.fingerprints);
  const Epoch resumed = epoch_batches(pipeline, sampler, batch, 3, 1, 3);
  EXPECT_EQ(resumed.fingerprints, std::vector<std::string>(one.fingerprints.begin() + 3, one.fingerprints.end()));
  // Another epoch: another order (and other flips).
  EXPECT_NE(epoch_batches(pipeline, sampler, batch, 2, 2, 0).fingerprints, one.fingerprints);
}

// The global order is grouped as one order of global batches: at any world size that divides the
// global batch, step s trains on the same samples.
TEST(GroupedBatches, TheGlobalOrderKeepsAStepsSamplesAtAnyWorldSize) {
  test::TempDir dir;
  const auto pipeline = coco_pipeline(dir, 40);
  const auto one = training_sampler(*pipeline, 4, "global");
  ASSERT_NE(one->describe().find("grouped by aspect ratio"), std::string::npos) << one->describe();
  const auto* grouped = dynamic_cast<const GroupedBatchSampler*>(one.get());
  ASSERT_NE(grouped, nullptr);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> whole = one->epoch_order(epoch);
    ASSERT_EQ(whole.size(), 40u);
    for (const int64_t ranks : {2, 4}) {
      const int64_t b = 4 / ranks;
      std::vector<std::vector<int64_t>> orders;
      for (int64_t r = 0; r < ranks; ++r) {
        const auto s = training_sampler(*pipeline, b, "global", {ranks, r, false});
        orders.push_back(s->epoch_order(epoch));
        ASSERT_EQ(s->num_samples(), 40 / ranks);
      }
      for (size_t step = 0; step < 10; ++step) {
        std::vector<int64_t> together;
        for (const auto& o : orders) together.insert(together.end(), o.begin() + step * b, o.begin() + (step + 1) * b);
        EXPECT_EQ(together, std::vector<int64_t>(whole.begin() + step * 4, whole.begin() + (step + 1) * 4))
            << "epoch " << epoch << " step " << step << " on " << ranks << " ranks";
        for (const int64_t i : together) EXPECT_EQ(grouped->group_ids()[i], grouped->group_ids()[together[0]]);
      }
    }
  }
}

TEST(GroupedBatches, OffWithFactorMinusOneOrWithoutImageSizes) {
  test::TempDir dir;
  const auto pipeline = coco_pipeline(dir, 12);
  const auto off = training_sampler(*pipeline, 3, "distributed", {}, -1);
  const DistributedSampler reference(12, /*shuffle=*/true, 99);
  EXPECT_EQ(off->describe(), reference.describe());
  EXPECT_EQ(off->epoch_order(4), reference.epoch_order(4));
  DataConfig config;
  SamplerBuild build(12, 99, {});
  build.batch = 3;  // no aspect ratios (a classification pipeline: aspect_ratios_of gives none)
  EXPECT_EQ(make_training_sampler(config, build)->epoch_order(4), reference.epoch_order(4));
  test::expect_bad_input([&] { training_sampler(*pipeline, 13); }, {"fewer than one batch of 13", "12 samples"});
  test::expect_bad_input([&] { training_sampler(*pipeline, 3, "distributed", {}, 1001); },
                         {"data.aspect_ratio_group_factor", "1001"});
}

}  // namespace
}  // namespace crucible::data
