// A detection sample's targets: its boxes, each with a class and a crowd flag, moved with the
// image by every transform. Boxes are xyxy in pixels of the image they belong to (torchvision's
// tv_tensors.BoundingBoxes in format XYXY), as float32, so that a transform's arithmetic is the
// oracle's. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::data {

struct Boxes {
  std::vector<float> xyxy;       // [size(), 4]: x1, y1, x2, y2
  std::vector<int64_t> labels;   // [size()]: contiguous class index (0 …)
  std::vector<uint8_t> iscrowd;  // [size()]: COCO's iscrowd (a crowd region, not an object)
  std::vector<int64_t> ids;      // [size()]: where the box came from (COCO annotation id; YOLO line)

  size_t size() const { return labels.size(); }
  bool empty() const { return labels.empty(); }
  void add(float x1, float y1, float x2, float y2, int64_t label, bool crowd, int64_t id);
  // Keeps box i where keep[i] != 0, in order.
  void keep(const std::vector<uint8_t>& keep);
};

// What a source does with a box that is not inside its image with a positive size
// (data.bad_boxes): clip it to the image and keep it when it still has an area (and drop it
// otherwise), drop it, or refuse the data set naming the file and the annotation.
enum class BadBoxPolicy { kClamp, kDrop, kRefuse };
const char* bad_box_policy_name(BadBoxPolicy policy);
BadBoxPolicy parse_bad_box_policy(const std::string& name, const std::string& key);

// What a detection source was told about its boxes (data.bad_boxes, data.max_boxes) and what it
// did: how many it clamped and dropped, which it says in the log.
struct BoxPolicy {
  BadBoxPolicy bad = BadBoxPolicy::kClamp;
  int64_t max_boxes = 10000;  // per image; more is refused (T16: memory grows with the box count)
};

struct BoxCounts {
  int64_t kept = 0, clamped = 0, dropped = 0;
  std::string line() const;  // "12034 boxes (3 clamped to their image, 1 dropped)"
};

// Applies `policy` to `box` (xyxy, float32) of an image `width` × `height` pixels: true to keep
// it (clipped under kClamp), false to drop it; counted in `counts`. A box is bad when it has no
// area (x2 <= x1 or y2 <= y1) or reaches outside the image. Under kRefuse, bad_input naming
// `where` (the file, the image and the annotation, as the source has them).
bool check_box(float box[4], int64_t width, int64_t height, BadBoxPolicy policy, const std::string& where,
               BoxCounts* counts);

}  // namespace crucible::data
