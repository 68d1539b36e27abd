// The registries of the data side of a recipe (see data_recipe.h). One line per entry; the
// order of sample_transform_registry() is the order a sample goes through them.
#include "crucible/data/data_recipe.h"

#include "crucible/core/config.h"
#include "crucible/data/transforms/augment.h"
#include "crucible/data/samplers/global_sampler.h"
#include "crucible/data/samplers/grouped_sampler.h"
#include "crucible/data/transforms/random_solarize.h"
#include "crucible/data/remote/remote.h"
#include "crucible/data/samplers/repeated_sampler.h"
#include "crucible/data/transforms/detection_presets.h"

namespace crucible::data {
namespace {

// data.sampler = "repeated": torchvision's RASampler(shuffle=True, repetitions=data.repeats).
std::shared_ptr<const Sampler> make_repeated_sampler(const RepeatedSamplerOptions& o, const SamplerBuild& b) {
  return std::make_shared<RepeatedAugmentationSampler>(b.size, /*shuffle=*/true, b.seed, o.repeats, b.shard);
}

// data.sampler = "distributed": PyTorch's DistributedSampler(shuffle=True).
std::shared_ptr<const Sampler> make_distributed_sampler(const DataConfig&, const SamplerBuild& b) {
  return std::make_shared<DistributedSampler>(b.size, /*shuffle=*/true, b.seed, b.shard);
}

// data.sampler = "global": one order at any world size, shuffled in windows of shards.
std::shared_ptr<const Sampler> make_global_sampler(const GlobalOrderOptions& o, const SamplerBuild& b) {
  return std::make_shared<GlobalOrderSampler>(b.size, b.shard_counts, o.shuffle_window, /*shuffle=*/true, b.seed,
                                              b.batch, b.shard);
}

// data.sampler = "auto": "global" for remote data (a bounded cache needs its windows), else
// "distributed" (X1: PyTorch's order).
std::shared_ptr<const Sampler> make_auto_sampler(const DataConfig& c, const SamplerBuild& b) {
  return sampler_registry().get(resolved_sampler("auto", b.remote), "data.sampler").factory.make(c, b);
}

}  // namespace

const Registry<SampleTransformPiece>& sample_transform_registry() {
  static const Registry<SampleTransformPiece> registry = [] {
    Registry<SampleTransformPiece> r("sample transform");
    r.add("hflip", "data.hflip: a random horizontal flip (torchvision's RandomHorizontalFlip)",
          sample_transform_piece<RandomHorizontalFlipOptions>("hflip", make_random_horizontal_flip));
    r.add("augment", "data.augment: RandAugment, TrivialAugmentWide, AutoAugment or AugMix (torchvision's v2)",
          sample_transform_piece<AugmentSettings>("augment", make_augment_piece));
    r.add("solarize", "data.solarize: torchvision's RandomSolarize",
          sample_transform_piece<RandomSolarizeOptions>("solarize", make_random_solarize));
    return r;
  }();
  return registry;
}

const Registry<SamplerPiece>& sampler_registry() {
  static const Registry<SamplerPiece> registry = [] {
    Registry<SamplerPiece> r("sampler");
    r.add("distributed", "PyTorch's DistributedSampler order, shuffled per (seed, epoch) (X1)",
          {nullptr, make_distributed_sampler});
    r.add("repeated", "torchvision's RASampler: repeated augmentation, data.repeats copies of each sample (DeiT)",
          sampler_piece<RepeatedSamplerOptions>("repeated", make_repeated_sampler));
    r.add("global", "one order at any world size (elastic resume), shuffled in windows of data.shuffle_window shards",
          sampler_piece<GlobalOrderOptions>("global", make_global_sampler));
    r.add("auto", "\"global\" for remote data (s3://, http(s)://), else \"distributed\"", {nullptr, make_auto_sampler});
    return r;
  }();
  return registry;
}

SampleTransforms training_transforms(const DataConfig& config, const ImageSpec& spec) {
  SampleTransforms chain;
  for (const auto& e : sample_transform_registry().entries()) {
    if (auto t = e.factory.make(config, spec)) chain.push_back(std::move(t));
  }
  return chain;
}

std::string resolved_sampler(const std::string& name, bool remote) {
  if (name != "auto") return name;
  return remote ? "global" : "distributed";
}

std::string resolved_sampler(const DataConfig& config) {
  return resolved_sampler(config.sampler,
                          config.dataset == DataConfig::Dataset::kImages && is_remote_path(config.train_path));
}

std::shared_ptr<const Sampler> make_training_sampler(const DataConfig& config, const SamplerBuild& build) {
  const auto& make = sampler_registry().get(config.sampler, "data.sampler").factory.make;
  const auto& d = config.pieces.get<DetectionSettings>(kDetectionPiece);
  const int64_t k = d.aspect_ratio_group_factor;
  const DetectionPreset* preset = &detection_preset_registry().get(d.preset, "data.detection_preset").factory;
  if (build.aspect_ratios.empty() || k < 0 || !preset->aspect_groups) return make(config, build);
  if (resolved_sampler(config.sampler, build.remote) != "global") {
    return std::make_shared<GroupedBatchSampler>(make(config, build), build.aspect_ratios, k, build.batch);
  }
  // The global order is one order at any world size: grouped as one (its one-rank order, in
  // global batches), then each global batch split, so a step's samples stay those of any world
  // size (grouping each rank's slice would tie them to the number of ranks).
  SamplerBuild one = build;
  one.shard = {1, 0, build.shard.drop_last};
  one.batch = build.batch * build.shard.num_replicas;
  return std::make_shared<GroupedBatchSampler>(make(config, one), build.aspect_ratios, k, build.batch, build.shard);
}

void declare_data_piece_settings(DataConfig& config, ConfigSchema& schema) {
  for (const auto& e : sample_transform_registry().entries()) {
    if (e.factory.declare) e.factory.declare(config, schema);
  }
  for (const auto& e : sampler_registry().entries()) {
    if (e.factory.declare) e.factory.declare(config, schema);
  }
}

std::vector<std::pair<std::string, std::string>> piece_arguments(const std::string& piece) {
  DataConfig config;
  ConfigSchema schema;
  const auto& declare = sample_transform_registry().get(piece, "sample transform").factory.declare;
  if (declare) declare(config, schema);
  std::vector<std::pair<std::string, std::string>> out;
  for (const ConfigKey* k : schema.keys()) {
    if (!k->arg().empty()) out.emplace_back(k->arg(), k->full_name());
  }
  return out;
}

}  // namespace crucible::data
