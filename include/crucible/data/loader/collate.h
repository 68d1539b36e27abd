// Detection batches: images of different sizes padded to one, boxes packed with per-image offsets
// (not a list of dicts), as GeneralizedRCNNTransform batches images and torchvision's detection
// models take their targets. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "crucible/data/loader/loader.h"
#include "crucible/data/transforms/detection.h"

namespace crucible::data {

// Writes `images` into `batch`: pixels [n, H, W, C] (or [n, C, H, W] when `channels_first`), each
// image at the top left of its slot and the rest pad_value, with H and W the largest height and
// width rounded up to a multiple of layout.size_divisible (or layout's fixed size); each image's
// own (height, width) in batch->image_sizes; the boxes packed in batch->boxes ([total, 4] xyxy),
// box_labels, box_crowd and box_offsets ([n + 1]: image i's boxes are [offsets[i], offsets[i+1])).
// `allocate` gives the pixel memory (LoaderOptions::allocate).
void collate_detection(std::vector<DetectionImage>& images, const DetectionBatchLayout& layout, bool channels_first,
                       const std::function<PixelBuffer(size_t bytes)>& allocate, Batch* batch);

}  // namespace crucible::data
