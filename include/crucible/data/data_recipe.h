// The data side of a recipe, as registries: the per-sample transforms a training pipeline runs
// on the loader threads (sample_transform.h), in registration order, and the samplers
// data.sampler names (sampler.h). Each entry is a piece: its settings, declared in its own file
// (an options struct, its keys, defaults, allowed values and help), and its factory. Adding one
// is a file pair and one line here (data_recipe.cpp). Torch-free: training, `crucible bench
// loader` and the Python loaders build the same pipelines from the same keys. Built once, then
// read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crucible/core/registry.h"
#include "crucible/data/data_config.h"
#include "crucible/data/image/image.h"
#include "crucible/data/transforms/sample_transform.h"
#include "crucible/data/samplers/sampler.h"

namespace crucible::data {

// A sample transform: the settings it declares and its factory. `declare` binds the piece's
// own keys to its options in config.pieces; `make` gives the transform for the training
// pipeline whose samples are `spec`, or null when the config does not turn it on, and throws
// bad_input for a setting it cannot honour.
struct SampleTransformPiece {
  std::function<void(DataConfig& config, ConfigSchema& schema)> declare;
  std::function<std::shared_ptr<const SampleTransform>(const DataConfig& config, const ImageSpec& spec)> make;
};
const Registry<SampleTransformPiece>& sample_transform_registry();

// The registry entry of a piece that keeps its settings in its own file: an options struct
// `Options` with its defaults, `declare_settings(ConfigSchema&, Options&)` declaring its keys
// (found by argument-dependent lookup), and `make` building the transform from them.
template <typename Options>
SampleTransformPiece sample_transform_piece(
    const std::string& name, std::shared_ptr<const SampleTransform> (*make)(const Options& options,
                                                                            const ImageSpec& spec)) {
  return {[name](DataConfig& c, ConfigSchema& schema) { declare_settings(schema, c.pieces.of<Options>(name)); },
          [name, make](const DataConfig& c, const ImageSpec& spec) { return make(c.pieces.get<Options>(name), spec); }};
}

// The training pipeline's chain: every registered transform the config turns on, in
// registration order. (Evaluation pipelines run none.)
SampleTransforms training_transforms(const DataConfig& config, const ImageSpec& spec);

// What a training sampler is built from: the data set's size, the sampler stream's seed, and
// this rank's shard.
struct SamplerBuild {
  SamplerBuild() = default;
  SamplerBuild(int64_t size, uint64_t seed, Sampler::Shard shard) : size(size), seed(seed), shard(shard) {}
  int64_t size = 0;
  uint64_t seed = 0;
  Sampler::Shard shard;
  int64_t batch = 0;                  // the per-rank (loader) batch: the global order's steps
  std::vector<int64_t> shard_counts;  // samples per shard (SampleSource::shard_counts); empty: unsharded
  bool remote = false;                // the samples come from URLs (data.sampler = "auto" picks "global")
  // Detection: each sample's width / height (aspect_ratios_of, grouped_sampler.h); with
  // data.aspect_ratio_group_factor >= 0 the batches are grouped by it. Empty: not grouped.
  std::vector<double> aspect_ratios;
};
// A sampler: its settings (none for some) and its factory.
struct SamplerPiece {
  std::function<void(DataConfig& config, ConfigSchema& schema)> declare;
  std::function<std::shared_ptr<const Sampler>(const DataConfig& config, const SamplerBuild& build)> make;
};
const Registry<SamplerPiece>& sampler_registry();

// As sample_transform_piece, for a sampler with settings.
template <typename Options>
SamplerPiece sampler_piece(const std::string& name,
                           std::shared_ptr<const Sampler> (*make)(const Options& options, const SamplerBuild& build)) {
  return {[name](DataConfig& c, ConfigSchema& schema) { declare_settings(schema, c.pieces.of<Options>(name)); },
          [name, make](const DataConfig& c, const SamplerBuild& b) { return make(c.pieces.get<Options>(name), b); }};
}

// The sampler `name` (data.sampler) stands for, "auto" resolved: "global" for remote data, else
// "distributed". The one place that rule lives.
std::string resolved_sampler(const std::string& name, bool remote);
// The same for a job's training data (a run folder written before "auto" existed names the one
// it picked).
std::string resolved_sampler(const DataConfig& config);

// The sampler data.sampler names (bad_input listing the known ones for another name); with
// build.aspect_ratios and data.aspect_ratio_group_factor >= 0, its batches grouped by aspect
// ratio (GroupedBatchSampler of build.batch; the global order grouped as one order of global
// batches, each split over the ranks).
std::shared_ptr<const Sampler> make_training_sampler(const DataConfig& config, const SamplerBuild& build);

// Binds every registered data piece's own settings (bind_data_config calls it).
void declare_data_piece_settings(DataConfig& config, ConfigSchema& schema);

// The keys of `piece`'s settings that carry the keyword of the library they mirror
// (ConfigKey::arg): {keyword, "data.key"}, for the Python loaders' options dicts.
std::vector<std::pair<std::string, std::string>> piece_arguments(const std::string& piece);

}  // namespace crucible::data
