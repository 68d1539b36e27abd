// The data side of a recipe, as registries: the per-sample transforms a training pipeline runs
// on the loader threads (data/sample_transform.h), in registration order, and the samplers
// data.sampler names (data/sampler.h). Adding one is a file with the transform or sampler and
// one line here (data_recipe.cpp). Torch-free: the loader benchmark and the Python module build
// the same pipelines as training. Built once, then read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "crucible/core/registry.h"
#include "crucible/data/image.h"
#include "crucible/data/sample_transform.h"
#include "crucible/data/sampler.h"
#include "crucible/train/job_config.h"

namespace crucible::train {

// A sample transform: the settings it declares and its factory. `make` gives the transform for
// the job's training pipeline whose samples are `spec`, or null when the job does not turn it
// on, and throws bad_input for a setting it cannot honour. `declare` binds the piece's own keys
// to its options in job.pieces (empty for the first pieces, whose keys are DataSection's).
struct SampleTransformPiece {
  std::function<void(JobConfig& job, ConfigSchema& schema)> declare;
  std::function<std::shared_ptr<const data::SampleTransform>(const JobConfig& job, const data::ImageSpec& spec)> make;
};
const Registry<SampleTransformPiece>& sample_transform_registry();

// The registry entry of a piece that keeps its settings in its own file: an options struct
// `Options` with its defaults, `declare_settings(ConfigSchema&, Options&)` declaring its keys
// (found by argument-dependent lookup), and `make` building the transform from them.
template <typename Options>
SampleTransformPiece sample_transform_piece(
    const std::string& name,
    std::shared_ptr<const data::SampleTransform> (*make)(const Options& options, const data::ImageSpec& spec)) {
  return {[name](JobConfig& job, ConfigSchema& schema) { declare_settings(schema, job.pieces.of<Options>(name)); },
          [name, make](const JobConfig& job, const data::ImageSpec& spec) {
            return make(job.pieces.get<Options>(name), spec);
          }};
}

// Binds every registered piece's own settings (bind_job_config calls it).
void declare_piece_settings(JobConfig& job, ConfigSchema& schema);

// The training pipeline's chain: every registered transform the job turns on, in registration
// order. (Evaluation pipelines run none.)
data::SampleTransforms training_transforms(const JobConfig& job, const data::ImageSpec& spec);

// What a training sampler is built from: the data set's size, the sampler stream's seed, and
// this rank's shard.
struct SamplerBuild {
  int64_t size = 0;
  uint64_t seed = 0;
  data::Sampler::Shard shard;
};
using SamplerFactory = std::function<std::shared_ptr<const data::Sampler>(const JobConfig& job, const SamplerBuild& b)>;
const Registry<SamplerFactory>& sampler_registry();

// The sampler data.sampler names (bad_input listing the known ones for another name).
std::shared_ptr<const data::Sampler> make_training_sampler(const JobConfig& job, const SamplerBuild& build);

}  // namespace crucible::train
