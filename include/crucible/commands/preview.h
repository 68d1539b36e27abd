// `crucible preview`: what the model sees. Writes a PNG grid of the first training samples of
// epoch 0 — after the crop, flip and augmentations, random erasing and MixUp/CutMix when the job
// sets them, before normalisation (un-normalised back to pixels) — each tile with its label
// under it ("3", or "3+7" for a mixed target: its two largest classes). The labels are also in
// the PNG's tEXt chunk "crucible.labels" (JSON: per tile, the class shares). Draws are the
// training run's own: the same seed gives the same tiles as step 0, 1, … of `crucible train`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "crucible/train/job_config.h"

namespace crucible::commands {

struct PreviewOptions {
  int64_t n = 64;   // samples shown (from as many batches as they take)
  std::string out;  // .png, written atomically
};

struct PreviewSummary {
  int64_t samples = 0;
  int64_t columns = 0, rows = 0;
  int64_t width = 0, height = 0;  // of the PNG
  int64_t batches = 0;            // training batches read
  bool mixed = false;             // MixUp/CutMix applied
  // (key, why) of the keys the job sets that preview does not apply (train.multi_scale), each
  // also warned of.
  std::vector<std::pair<std::string, std::string>> not_applied;
};

// bad_input for n < 1, an output not ending in .png, and data that are float features (no pixels).
PreviewSummary preview(const train::JobConfig& config, const PreviewOptions& options);

// A detection set's (data.dataset = "detection"; preview() hands it over): the first training
// images of epoch 0 after data.detection_preset's transforms, each box drawn in its class's colour
// with the class name at its corner, the image id under the tile; the boxes, in the augmented
// images' pixels, in the PNG's tEXt chunk "crucible.boxes" (JSON: per tile image_id, sample,
// width, height, boxes, labels).
PreviewSummary preview_detection(const train::JobConfig& config, const PreviewOptions& options);

}  // namespace crucible::commands
