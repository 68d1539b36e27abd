// Detection evaluation with COCO's numbers, across ranks (X5): each rank runs the detector over
// its share of the test set, the per-image detections of every rank are gathered, the sampler's
// padding (an image evaluated twice) is dropped, and COCOeval's 12 numbers are computed once
// from them (data/eval/coco_eval.h), as a single process would. An image is detected on its
// own (a batch of one), so its detections do not depend on the rank or the batch it fell in:
// one rank and several give the same detections, bit for bit, and so the same numbers. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "crucible/data/eval/coco_eval.h"

namespace crucible::nn {
class Detector;
}
namespace crucible::data {
class Loader;
struct Batch;
}
namespace crucible::distributed {
class Comm;
}

namespace crucible::train {

struct DetectionEval {
  data::CocoEvalResult coco;
  int64_t images = 0;                        // distinct images evaluated, over every rank
  std::vector<data::CocoDetection> results;  // every detection (COCO results: category ids, xywh),
                                             // by sample then score, as predict writes them
};

// `detector` (put in eval mode, without gradients, its mode restored after) over epoch 0 of
// `loader`'s detection batches, on `device`; labels map to `category_ids` (empty: the label is
// the category id). `comm` null in a single process. Every rank gets the same result.
// Image `j` of a detection batch as the detector takes it: [3, h, w] float in 0–1 on `device`.
at::Tensor detection_image(const data::Batch& batch, int64_t j, c10::Device device);

DetectionEval evaluate_detections(nn::Detector& detector, data::Loader& loader, const data::CocoGroundTruth& truth,
                                  c10::Device device, distributed::Comm* comm);

}  // namespace crucible::train
