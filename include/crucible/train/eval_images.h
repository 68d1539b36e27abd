// A detector's test images with their true and predicted boxes, for the report (issue 48): what a
// user looks at before trusting an AP. The first images of the test loader's epoch 0 (this rank's
// share), each detected alone as the evaluation detects it (detection_eval.h), in a grid: true
// boxes in white, the best detections scoring at least `min_score` in their class's colour with the class
// name and score. The PNG's tEXt chunk "crucible.eval_boxes" holds, per tile, the image id, its
// size, "truth" [[x1, y1, x2, y2, label, crowd], …] and "detections" [[x1, y1, x2, y2, label,
// score], …] in the image's pixels: every detection of the image, drawn or not. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace crucible::nn {
class Detector;
}
namespace crucible::data {
class Loader;
}

namespace crucible::train {

struct EvalImagesOptions {
  int64_t images = 8;       // tiles
  double min_score = 0.4;   // detections drawn: the best, scoring at least this (all are in the chunk) …
  int64_t max_drawn = 10;   // … at most this many per image
};

// Writes the grid to `path` atomically; returns the number of tiles.
int64_t write_eval_images(nn::Detector& detector, data::Loader& test_loader, c10::Device device,
                          const std::string& path, const EvalImagesOptions& options = {});

}  // namespace crucible::train
