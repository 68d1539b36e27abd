// The detection presets of torchvision's references/detection/presets.py (DetectionPresetTrain
// with use_v2: its transforms, then SanitizeBoundingBoxes), each one setting,
// data.detection_preset: a registry entry holding the training chain, the evaluation chain and
// the batch layout. The detection keys of [data] are declared here (DetectionSettings). Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crucible/core/registry.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/transforms/detection.h"
#include "crucible/data/transforms/yolox.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

struct DataConfig;

constexpr const char* kDetectionPiece = "detection";

struct DetectionSettings {
  std::string preset = "hflip";                   // data.detection_preset (references' --data-augmentation)
  std::string bad_boxes = "clamp";                // data.bad_boxes
  int64_t max_boxes = 10000;                      // data.max_boxes
  std::string images_root;                        // data.images_root: a COCO training file's images
  std::string test_images_root;                   // data.test_images_root: the evaluation file's
  int64_t size_divisible = 32;                    // data.size_divisible
  int64_t aspect_ratio_group_factor = 3;          // data.aspect_ratio_group_factor (grouped_sampler.h); -1: off
  std::vector<double> fill = {123.0, 117.0, 104.0};  // data.detection_fill: the presets' `mean` (pad colour)
  int64_t lsj_size = 1024;                        // data.lsj_size: the "lsj" preset's square size
  YoloxSettings yolox;                            // data.yolox_*: the "yolox" preset's (yolox.h)
};
void declare_settings(ConfigSchema& schema, DetectionSettings& settings);

// A preset: its transforms for training and for evaluation, and how its batches are laid out,
// from the job's [data] (the preset's own settings, data.hflip, data.size_divisible, …).
struct DetectionPreset {
  std::function<DetectionTransforms(const DataConfig& config)> train;
  std::function<DetectionTransforms(const DataConfig& config)> eval;                // null: none
  std::function<DetectionBatchLayout(const DataConfig& config)> layout;             // null: padded, fill 0
  // Whether training batches are grouped by aspect ratio (data.aspect_ratio_group_factor), as
  // torchvision's train.py groups every preset's; YOLOX's trainer does not group its mosaics.
  bool aspect_groups = true;
};
const Registry<DetectionPreset>& detection_preset_registry();

// The source options a detection split is opened with (data.bad_boxes, data.max_boxes, the images root).
SourceOptions detection_source_options(const DataConfig& config, bool train);

}  // namespace crucible::data
