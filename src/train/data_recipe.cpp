// The registries of the data side of a recipe (see data_recipe.h). One line per entry; the
// order of sample_transform_registry() is the order a sample goes through them.
#include "crucible/train/data_recipe.h"

#include "crucible/core/log.h"

namespace crucible::train {
namespace {

// data.hflip: torchvision's RandomHorizontalFlip(p), first after the crop (its preset order).
std::shared_ptr<const data::SampleTransform> make_flip(const JobConfig& job, const data::ImageSpec& spec) {
  if (job.data.hflip <= 0) return nullptr;
  if (spec.type == data::SampleType::kFeatures) {
    log_info("data: data.hflip = {} does not apply to float features (used as they are)", job.data.hflip);
    return nullptr;
  }
  return std::make_shared<data::RandomHorizontalFlip>(static_cast<float>(job.data.hflip));
}

}  // namespace

const Registry<SampleTransformFactory>& sample_transform_registry() {
  static const Registry<SampleTransformFactory> registry = [] {
    Registry<SampleTransformFactory> r("sample transform");
    r.add("hflip", "data.hflip: a random horizontal flip (torchvision's RandomHorizontalFlip)", make_flip);
    return r;
  }();
  return registry;
}

data::SampleTransforms training_transforms(const JobConfig& job, const data::ImageSpec& spec) {
  data::SampleTransforms chain;
  for (const auto& e : sample_transform_registry().entries()) {
    if (auto t = e.factory(job, spec)) chain.push_back(std::move(t));
  }
  return chain;
}

const Registry<SamplerFactory>& sampler_registry() {
  static const Registry<SamplerFactory> registry = [] {
    Registry<SamplerFactory> r("sampler");
    r.add("distributed", "PyTorch's DistributedSampler order, shuffled per (seed, epoch) (X1)",
          [](const JobConfig&, const SamplerBuild& b) {
            return std::make_shared<data::DistributedSampler>(b.size, /*shuffle=*/true, b.seed, b.shard);
          });
    return r;
  }();
  return registry;
}

std::shared_ptr<const data::Sampler> make_training_sampler(const JobConfig& job, const SamplerBuild& build) {
  return sampler_registry().get(job.data.sampler, "data.sampler").factory(job, build);
}

}  // namespace crucible::train
