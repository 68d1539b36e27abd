// Batch transforms: on the device, between DeviceInput (normalised images, targets) and the
// training step, for every training batch (never for evaluation). A transform may change the
// images' values or size and may replace the targets by soft targets [B, classes] float, which
// both losses then take as probabilities (MixUp/CutMix). Draws must come from (seed, step, rank)
// — or, per sample, from (seed, epoch, sample index) — so resumed and rerun steps are exact. The chain a job runs is built from the registry in train/recipe.cpp; multi-scale
// training (M4) is the first entry. Not thread-safe: one chain per trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "crucible/nn/detection/detector.h"  // BoxTargets

namespace crucible::train {

struct DeviceBatch {
  at::Tensor images;   // [B, C, H, W] float, normalised, on the device (the model's memory format)
  at::Tensor targets;  // [B] int64 class ids, or [B, classes] float (multi-hot or soft targets)
  int64_t step = 0;    // the optimizer step this batch trains (0-based, global)
  int64_t rank = 0;    // this process's rank (0 in a single process)
  int64_t epoch = 0;   // the epoch the batch belongs to
  std::vector<int64_t> sample_ids;  // each image's sample index (per-sample draws key on (epoch, id))
  std::vector<int64_t> copies;      // each image's copy number (repeated augmentation; empty: all 0):
                                    // per-sample draws key on data::draw_epoch(epoch, copy)
  // Detection (empty otherwise): each image's own [height, width] inside the padded `images`
  // ([B × 2], host values) and its ground truth on the device (crowd boxes left out, as
  // torchvision's reference leaves them out of training); `targets` is unused.
  std::vector<int64_t> image_sizes;
  std::vector<nn::BoxTargets> boxes;
  // Detection: the shorter side this step trains at (train.multi_scale, M4: the detector's resize
  // takes it in place of model.min_size; max_size still caps the longer side); 0: model.min_size.
  int64_t min_size = 0;
  bool detection() const { return !image_sizes.empty(); }
};

class BatchTransform {
 public:
  virtual ~BatchTransform() = default;
  virtual void apply(DeviceBatch& batch) = 0;
  virtual std::string describe() const = 0;  // one phrase for the log
  // Whether it keeps a detection batch's boxes true to its images (a detection set refuses the
  // transforms that move or mix pixels without their boxes).
  virtual bool keeps_boxes() const { return false; }
};

using BatchTransforms = std::vector<std::unique_ptr<BatchTransform>>;

// Applies every transform in order.
void apply_batch_transforms(const BatchTransforms& transforms, DeviceBatch& batch);

}  // namespace crucible::train
