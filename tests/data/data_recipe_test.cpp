// The data side of a recipe (data/data_recipe.h): the registries' entries and order, the chain
// a [data] config turns on, the flip as a sample transform (in place, either layout), and the
// sampler data.sampler names — DistributedSampler's order (X1). To add a case for a new entry:
// build a DataConfig that turns it on and compare its output with the reference it claims.
#include "crucible/data/data_recipe.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/rng.h"
#include "crucible/data/transforms/augment.h"
#include "crucible/data/transforms/random_solarize.h"
#include "crucible/data/samplers/repeated_sampler.h"
#include "crucible/data/transforms/transform.h"
#include "crucible/train/job_config.h"
#include "test_util.h"

namespace crucible::data {
namespace {

const data::ImageSpec kPixels{4, 5, 3, data::ColorOrder::kRGB};

TEST(DataRecipe, RegistriesListTheirEntriesInChainOrder) {
  EXPECT_EQ(sample_transform_registry().names(), (std::vector<std::string>{"hflip", "augment", "solarize"}));
  EXPECT_EQ(sampler_registry().names(), (std::vector<std::string>{"distributed", "repeated", "global", "auto"}));
}

TEST(DataRecipe, TheChainHoldsWhatTheConfigTurnsOn) {
  DataConfig job;
  double& hflip = job.pieces.of<data::RandomHorizontalFlipOptions>("hflip").p;
  hflip = 0.25;
  const data::SampleTransforms chain = training_transforms(job, kPixels);
  ASSERT_EQ(chain.size(), 1u);
  EXPECT_EQ(chain[0]->describe(), "flip p=0.25");
  hflip = 0;
  EXPECT_TRUE(training_transforms(job, kPixels).empty());
  hflip = 0.5;
  data::ImageSpec features = kPixels;
  features.type = data::SampleType::kFeatures;
  EXPECT_TRUE(training_transforms(job, features).empty());  // float features are used as they are
}

// data.augment: after the flip (torchvision's preset order), with the options of its keys; an
// augmentation of float features, or a fill of the wrong length, is refused naming the key.
TEST(DataRecipe, AugmentFollowsTheFlipWithItsOptions) {
  DataConfig job;
  job.pieces.of<data::RandomHorizontalFlipOptions>("hflip").p = 0.5;
  AugmentSettings& augment = job.pieces.of<AugmentSettings>("augment");
  augment.name = "randaugment";
  augment.num_ops = 3;
  augment.magnitude = 5;
  augment.interpolation = "bilinear";
  augment.fill = {7, 8, 9};
  data::SampleTransforms chain = training_transforms(job, kPixels);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0]->describe(), "flip p=0.5");
  EXPECT_EQ(chain[1]->describe(), "randaugment (3 ops at magnitude 5/31, bilinear, fill 7,8,9)");
  augment.name = "trivialaugment_wide";
  augment.interpolation = "auto";
  augment.fill = {};
  chain = training_transforms(job, kPixels);
  EXPECT_EQ(chain[1]->describe(), "trivialaugment_wide (31 bins, nearest)");
  augment.name = "augmix";
  EXPECT_EQ(training_transforms(job, kPixels)[1]->describe(),
            "augmix (severity 3, width 3, depth 1-3, alpha 1, all ops, bilinear)");
  augment.fill = {1, 2};
  try {
    training_transforms(job, kPixels);
    ADD_FAILURE() << "a fill of 2 values for 3 channels was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.augment_fill"), std::string::npos) << e.what();
  }
  augment.fill = {};
  data::ImageSpec features = kPixels;
  features.type = data::SampleType::kFeatures;
  EXPECT_THROW(training_transforms(job, features), Error);
  augment.name = "randaugment";
  augment.magnitude = 31;  // bins are 0..30
  EXPECT_THROW(training_transforms(job, kPixels), Error);
}

// The flip as a chain element: each sample mirrored or not by one draw of its own stream, the
// same pixels as hflip_image, planes mirrored plane by plane.
TEST(DataRecipe, FlipMirrorsInPlaceInEitherLayoutFromTheSampleStream) {
  const data::RandomHorizontalFlip flip(0.5f);
  int mirrored = 0;
  for (uint64_t index = 0; index < 64; ++index) {
    std::vector<uint8_t> hwc(4 * 5 * 3), chw(hwc.size());
    std::iota(hwc.begin(), hwc.end(), 0);
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 20; ++p) chw[c * 20 + p] = hwc[p * 3 + c];
    }
    std::vector<uint8_t> expect_hwc = hwc, expect_chw = chw;
    SampleRng reference(9, 1, index);
    const bool mirror = reference.bernoulli(0.5f);
    if (mirror) {
      data::hflip_image(expect_hwc.data(), 5, 4, 3);
      for (int c = 0; c < 3; ++c) data::hflip_image(expect_chw.data() + c * 20, 5, 4, 1);
    }
    mirrored += mirror;
    SampleRng r1(9, 1, index), r2(9, 1, index), r3(9, 1, index);
    flip.apply({hwc.data(), 5, 4, 3, false}, r1);
    flip.apply({chw.data(), 5, 4, 3, true}, r2);
    EXPECT_EQ(hwc, expect_hwc) << index;
    EXPECT_EQ(chw, expect_chw) << index;
    bool folded = false;
    ASSERT_TRUE(flip.fold_mirror(r3, &folded));
    EXPECT_EQ(folded, mirror) << index;
    EXPECT_EQ(r1.next_u32(), reference.next_u32());  // one draw each, then the stream goes on alike
    EXPECT_EQ(r3.next_u32(), r2.next_u32());
  }
  EXPECT_GT(mirrored, 16);
  EXPECT_LT(mirrored, 48);
  test::expect_bad_input([] { data::RandomHorizontalFlip(1.5f); }, {"probability", "1.5"});
}

// X1: data.sampler = "distributed" is DistributedSampler's order for the job's stream and shard.
TEST(DataRecipe, TheDefaultSamplerIsDistributedSamplerX1) {
  DataConfig job;
  const data::Sampler::Shard shard{3, 1, false};
  const auto s = make_training_sampler(job, {1000, 77, shard});
  const data::DistributedSampler reference(1000, /*shuffle=*/true, 77, shard);
  EXPECT_EQ(s->num_samples(), reference.num_samples());
  for (int64_t epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(s->epoch_order(epoch), reference.epoch_order(epoch));
  EXPECT_NE(s->epoch_order(0), s->epoch_order(1));
  job.sampler = "sequential";
  test::expect_bad_input([&] { make_training_sampler(job, {10, 0, {}}); },
                         {"data.sampler", "sequential", "distributed", "repeated"});
}

// X1: data.sampler = "repeated" is torchvision's RASampler (shuffled) for the job's stream, its
// shard and data.repeats copies (sampler_test.cpp compares that class with RASampler itself).
TEST(DataRecipe, RepeatedIsRASamplerWithDataRepeatsX1) {
  DataConfig job;
  job.sampler = "repeated";
  EXPECT_EQ(job.pieces.of<RepeatedSamplerOptions>("repeated").repeats, 3);  // train.py's --ra-reps default
  job.pieces.of<RepeatedSamplerOptions>("repeated").repeats = 4;
  const data::Sampler::Shard shard{3, 2, false};
  const auto s = make_training_sampler(job, {1000, 77, shard});
  const data::RepeatedAugmentationSampler reference(1000, /*shuffle=*/true, 77, 4, shard);
  EXPECT_EQ(s->num_samples(), 256);  // 1000 // 256 * 256 / 3
  for (int64_t epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(s->epoch_order(epoch), reference.epoch_order(epoch));
  EXPECT_EQ(s->describe(), "RASampler (shuffled, 4 repeats, rank 2 of 3): 256 samples an epoch");
  test::expect_bad_input([&] { make_training_sampler(job, {200, 0, {}}); },
                         {"data.sampler = \"repeated\"", "200 samples", "at least 256"});
}

// A piece that declares its settings in its own file (data.solarize, random_solarize.cpp): the
// keys are the config's like any other (loaded, checked, in --help and the resolved TOML), the
// options live in DataConfig::pieces (copied deeply with the config), and the factory reads them:
// the transform follows the flip and the automatic augmentation.
TEST(DataRecipe, APieceDeclaresItsOwnSettings) {
  DataConfig job;
  ConfigSchema schema;
  bind_data_config(job, schema);
  EXPECT_NE(schema.help_text().find("solarize_threshold"), std::string::npos);
  EXPECT_NE(schema.to_toml().find("solarize = 0.0"), std::string::npos);
  schema.load_string("[data]\nsolarize = 0.25\nsolarize_threshold = 100.5\nhflip = 0.5\naugment = \"autoaugment\"\n",
                     "ok.toml");
  EXPECT_EQ(job.pieces.get<data::RandomSolarizeOptions>("solarize").p, 0.25);
  EXPECT_EQ(job.pieces.get<data::RandomSolarizeOptions>("solarize").threshold, 100.5);
  const data::SampleTransforms chain = training_transforms(job, kPixels);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[2]->describe(), "solarize p=0.25 threshold=100.5");
  DataConfig copy = job;  // deep: the copy's settings are its own
  copy.pieces.of<data::RandomSolarizeOptions>("solarize").p = 0;
  EXPECT_EQ(job.pieces.get<data::RandomSolarizeOptions>("solarize").p, 0.25);
  EXPECT_EQ(training_transforms(copy, kPixels).size(), 2u);
  test::expect_bad_input([&] { schema.load_string("[data]\nsolarize = 1.5\n", "bad.toml"); }, {"data.solarize", "1.5"});
  test::expect_bad_input([&] { schema.load_string("[data]\nsolarize_threshold = 256\n", "bad.toml"); },
                         {"data.solarize_threshold", "256"});
  data::ImageSpec features = kPixels;
  features.type = data::SampleType::kFeatures;
  job.pieces.of<data::RandomHorizontalFlipOptions>("hflip").p = 0;
  job.pieces.of<AugmentSettings>("augment").name = "none";
  test::expect_bad_input([&] { training_transforms(job, features); }, {"data.solarize", "float features"});
  DataConfig fresh;  // never bound: the defaults, off
  EXPECT_EQ(fresh.pieces.get<data::RandomSolarizeOptions>("solarize").p, 0);
  EXPECT_EQ(training_transforms(fresh, kPixels).size(), 1u);  // the default flip alone
}

TEST(DataRecipe, DataSamplerIsACheckedKey) {
  DataConfig job;
  ConfigSchema schema;
  bind_data_config(job, schema);
  schema.load_string("[data]\nsampler = \"distributed\"\n", "ok.toml");
  EXPECT_EQ(job.sampler, "distributed");
  test::expect_bad_input([&] { schema.load_string("[data]\nsampler = \"shuffled\"\n", "bad.toml"); },
                         {"data.sampler", "shuffled"});
  schema.load_string("[data]\nsampler = \"repeated\"\nrepeats = 2\n", "ok.toml");
  EXPECT_EQ(job.sampler, "repeated");
  EXPECT_EQ(job.pieces.get<RepeatedSamplerOptions>("repeated").repeats, 2);
  test::expect_bad_input([&] { schema.load_string("[data]\nrepeats = 0\n", "bad.toml"); }, {"data.repeats"});
}

// The data commands (`crucible bench loader`, the Python loaders) bind the [data] keys alone and
// start from the data layer's defaults: those are the default job's [data] (configs/
// fashion_mnist.toml), key for key, so a data command reads what `crucible train` would.
TEST(DataRecipe, TheDataLayersDefaultsAreTheDefaultJobsData) {
  const std::string toml = read_file(std::string(CRUCIBLE_TEST_SUPPORT_DIR) + "/../../configs/fashion_mnist.toml");
  train::JobConfig job;
  ConfigSchema full;
  train::bind_job_config(job, full);
  full.load_string(toml, "configs/fashion_mnist.toml");
  DataConfig config;
  ConfigSchema alone;
  bind_data_config(config, alone);
  std::map<std::string, std::string> defaults;
  for (const auto& [key, value] : alone.values()) defaults[key] = value;
  int compared = 0;
  for (const auto& [key, value] : full.values()) {
    const auto it = defaults.find(key);
    if (key.rfind("data.", 0) != 0 || it == defaults.end()) continue;  // the train pieces' data.* keys
    EXPECT_EQ(it->second, value) << key;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(defaults.size()));  // every data-layer key is the job's too
  EXPECT_GT(compared, 40);
}

// The Python loaders' augment_options take torchvision's keywords; each comes from the key's
// own declaration (ConfigKey::arg in augment.cpp), not from a table in the Python module.
TEST(DataRecipe, PieceArgumentsComeFromTheDeclaration) {
  const auto args = piece_arguments("augment");
  std::map<std::string, std::string> by_arg(args.begin(), args.end());
  EXPECT_EQ(by_arg.size(), 11u);
  EXPECT_EQ(by_arg["num_ops"], "data.augment_num_ops");
  EXPECT_EQ(by_arg["num_magnitude_bins"], "data.augment_bins");
  EXPECT_EQ(by_arg["mixture_width"], "data.augmix_width");
  EXPECT_TRUE(piece_arguments("solarize").empty());  // its keys mirror no keyword of their own
  test::expect_bad_input([] { piece_arguments("blur"); }, {"blur", "hflip", "augment", "solarize"});
}

}  // namespace
}  // namespace crucible::data
