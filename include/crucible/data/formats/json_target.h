// A detection sample's target as one JSON object: the per-sample target of WebDataset shards
// (the sample's "json" member) and of packed detection sets (stored after the image's bytes).
// Its keys are torchvision's detection target dict's, so json.dumps of a target's lists writes one:
//   {"boxes": [[x1, y1, x2, y2], ...],  xyxy in pixels of the stored image (float32 exactly)
//    "labels": [l, ...],                 contiguous class indices, one per box
//    "iscrowd": [0, ...],                optional (all 0)
//    "image_id": 139,                    optional (-1)
//    "width": 640, "height": 426,        optional: the stored image's size, else read from its header
//    "ids": [a, ...]}                    optional: where each box came from (a COCO annotation id)
// An image without boxes is a background sample: "boxes": []. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "crucible/data/image/boxes.h"

namespace crucible::data {

struct JsonTarget {
  std::shared_ptr<const Boxes> boxes;
  int64_t image_id = -1;
  int width = 0, height = 0;  // 0: the JSON does not say
};

// Whether `data` is a JSON object with a "boxes" key: a detection target, not other metadata (a
// classification shard's .json member, which WebDataset sets often carry, stays metadata).
bool is_json_target(const uint8_t* data, size_t size);

// Parses a target. Each box is checked against the image by `policy` (check_box: clamped, dropped
// or refused, counted in `counts`) with the size the JSON states, else `width` × `height` (what
// the caller read from the image; both 0 when it has none, then boxes are not checked against it).
// bad_input naming `where` and the box: JSON that does not parse, a key of the wrong type,
// "labels" (or "iscrowd", "ids") not one per box, a box of other than 4 numbers, a label < 0 or
// >= `classes` (when classes > 0), more than policy.max_boxes boxes.
JsonTarget parse_json_target(const uint8_t* data, size_t size, const std::string& where, const BoxPolicy& policy,
                             int width, int height, int64_t classes, BoxCounts* counts);

// The JSON object parse_json_target reads back bit-exactly (boxes as float32 values).
std::string json_target(const Boxes& boxes, int64_t image_id, int width, int height);

}  // namespace crucible::data
