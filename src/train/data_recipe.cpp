// The registries of the data side of a recipe (see data_recipe.h). One line per entry; the
// order of sample_transform_registry() is the order a sample goes through them.
#include "crucible/train/data_recipe.h"

#include <algorithm>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/augment.h"
#include "crucible/data/random_solarize.h"
#include "crucible/data/repeated_sampler.h"

namespace crucible::train {
namespace {

// data.sampler = "repeated": torchvision's RASampler(shuffle=True, repetitions=data.repeats).
std::shared_ptr<const data::Sampler> make_repeated_sampler(const JobConfig& job, const SamplerBuild& b) {
  return std::make_shared<data::RepeatedAugmentationSampler>(b.size, /*shuffle=*/true, b.seed, job.data.repeats,
                                                             b.shard);
}

// data.augment: torchvision's automatic augmentation policies (data/augment.h), after the flip.
std::shared_ptr<const data::SampleTransform> make_augment(const JobConfig& job, const data::ImageSpec& spec) {
  const DataSection& d = job.data;
  if (d.augment == "none") return nullptr;
  if (spec.type == data::SampleType::kFeatures) {
    throw bad_input("data.augment = \"{}\" needs images; this data set holds float features", d.augment);
  }
  data::AugmentOptions o;
  o.name = d.augment;
  o.num_ops = static_cast<int>(d.augment_num_ops);
  o.magnitude = static_cast<int>(d.augment_magnitude);
  o.num_magnitude_bins = static_cast<int>(d.augment_bins);
  o.policy = d.augment_policy;
  o.interpolation = d.augment_interpolation == "auto" ? "" : d.augment_interpolation;
  if (!d.augment_fill.empty()) {
    if (d.augment_fill.size() != 1 && d.augment_fill.size() != static_cast<size_t>(spec.channels)) {
      throw bad_input("data.augment_fill: one value or one per channel ({}) expected, found {}", spec.channels,
                      d.augment_fill.size());
    }
    o.fill.set = true;
    for (size_t c = 0; c < 3; ++c) {
      o.fill.value[c] = static_cast<float>(d.augment_fill[d.augment_fill.size() == 1 ? 0 : std::min(c, d.augment_fill.size() - 1)]);
    }
  }
  o.severity = static_cast<int>(d.augmix_severity);
  o.mixture_width = static_cast<int>(d.augmix_width);
  o.chain_depth = static_cast<int>(d.augmix_depth);
  o.alpha = d.augmix_alpha;
  o.all_ops = d.augmix_all_ops;
  return data::make_augment(o);
}

}  // namespace

const Registry<SampleTransformPiece>& sample_transform_registry() {
  static const Registry<SampleTransformPiece> registry = [] {
    Registry<SampleTransformPiece> r("sample transform");
    r.add("hflip", "data.hflip: a random horizontal flip (torchvision's RandomHorizontalFlip)",
          sample_transform_piece<data::RandomHorizontalFlipOptions>("hflip", data::make_random_horizontal_flip));
    r.add("augment", "data.augment: RandAugment, TrivialAugmentWide, AutoAugment or AugMix (torchvision's v2)",
          {nullptr, make_augment});
    r.add("solarize", "data.solarize: torchvision's RandomSolarize",
          sample_transform_piece<data::RandomSolarizeOptions>("solarize", data::make_random_solarize));
    return r;
  }();
  return registry;
}

data::SampleTransforms training_transforms(const JobConfig& job, const data::ImageSpec& spec) {
  data::SampleTransforms chain;
  for (const auto& e : sample_transform_registry().entries()) {
    if (auto t = e.factory.make(job, spec)) chain.push_back(std::move(t));
  }
  return chain;
}

void declare_piece_settings(JobConfig& job, ConfigSchema& schema) {
  for (const auto& e : sample_transform_registry().entries()) {
    if (e.factory.declare) e.factory.declare(job, schema);
  }
}

const Registry<SamplerFactory>& sampler_registry() {
  static const Registry<SamplerFactory> registry = [] {
    Registry<SamplerFactory> r("sampler");
    r.add("distributed", "PyTorch's DistributedSampler order, shuffled per (seed, epoch) (X1)",
          [](const JobConfig&, const SamplerBuild& b) {
            return std::make_shared<data::DistributedSampler>(b.size, /*shuffle=*/true, b.seed, b.shard);
          });
    r.add("repeated", "torchvision's RASampler: repeated augmentation, data.repeats copies of each sample (DeiT)",
          make_repeated_sampler);
    return r;
  }();
  return registry;
}

std::shared_ptr<const data::Sampler> make_training_sampler(const JobConfig& job, const SamplerBuild& build) {
  return sampler_registry().get(job.data.sampler, "data.sampler").factory(job, build);
}

}  // namespace crucible::train
