// MixUp and CutMix (data.mixup_alpha, data.cutmix_alpha) and random erasing (data.random_erase) as
// batch transforms, equal to torchvision.transforms.v2's MixUp/CutMix (chosen per batch by
// RandomChoice when both are set, as references/classification/train.py does) and RandomErasing.
// The draws are pure, torch-free functions (data/transforms/batch_draws.h): MixUp/CutMix of (seed, step,
// rank), erasing of (seed, epoch, sample index) — a resumed or rerun step draws what it drew before.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "crucible/data/transforms/batch_draws.h"
#include "crucible/data/transforms/batch_settings.h"

namespace crucible::train {

// The pieces' settings are [data] keys, so the data layer declares them (data/transforms/batch_settings.h:
// bound by bind_data_config into DataConfig::pieces, by the names recipe.cpp registers).
using data::kMixUpCutMixPiece;
using data::kRandomErasingPiece;
using data::MixUpCutMixOptions;
using data::RandomErasingOptions;

// The draws (CutMixBox, cutmix_box, MixDraw, draw_mix, EraseBox, draw_erase) are the data layer's
// (data/transforms/batch_draws.h), so that the data commands and the Python module reach them too.
using data::CutMixBox;
using data::cutmix_box;
using data::draw_erase;
using data::draw_mix;
using data::EraseBox;
using data::MixDraw;

// The batch transforms themselves (the registry's factories in recipe.cpp check the job's keys and
// call these). MixUp/CutMix turn the targets into [B, classes] float soft targets.
class BatchTransform;
std::unique_ptr<BatchTransform> mixup_cutmix_transform(uint64_t seed, double mixup_alpha, double cutmix_alpha,
                                                       int64_t classes);
std::unique_ptr<BatchTransform> random_erasing_transform(uint64_t seed, double p, std::vector<double> scale,
                                                         std::vector<double> ratio, std::vector<double> value);

}  // namespace crucible::train
