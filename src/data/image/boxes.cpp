// Boxes and the bad-box policy (see boxes.h).
#include "crucible/data/image/boxes.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "crucible/core/error.h"

namespace crucible::data {

void Boxes::add(float x1, float y1, float x2, float y2, int64_t label, bool crowd, int64_t id) {
  xyxy.insert(xyxy.end(), {x1, y1, x2, y2});
  labels.push_back(label);
  iscrowd.push_back(crowd ? 1 : 0);
  ids.push_back(id);
}

void Boxes::keep(const std::vector<uint8_t>& keep) {
  if (keep.size() != size()) throw std::logic_error("Boxes::keep: one flag per box expected");
  size_t o = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    if (!keep[i]) continue;
    std::copy(xyxy.begin() + 4 * i, xyxy.begin() + 4 * i + 4, xyxy.begin() + 4 * o);
    labels[o] = labels[i];
    iscrowd[o] = iscrowd[i];
    ids[o] = ids[i];
    ++o;
  }
  xyxy.resize(4 * o);
  labels.resize(o);
  iscrowd.resize(o);
  ids.resize(o);
}

const char* bad_box_policy_name(BadBoxPolicy policy) {
  switch (policy) {
    case BadBoxPolicy::kClamp: return "clamp";
    case BadBoxPolicy::kDrop: return "drop";
    case BadBoxPolicy::kRefuse: return "refuse";
  }
  return "?";
}

BadBoxPolicy parse_bad_box_policy(const std::string& name, const std::string& key) {
  if (name == "clamp") return BadBoxPolicy::kClamp;
  if (name == "drop") return BadBoxPolicy::kDrop;
  if (name == "refuse") return BadBoxPolicy::kRefuse;
  throw bad_input("{} = \"{}\": expected \"clamp\", \"drop\" or \"refuse\"", key, name);
}

std::string BoxCounts::line() const {
  std::string out = fmt::format("{} boxes", kept);
  if (clamped > 0 || dropped > 0) {
    out += fmt::format(" ({} clamped to their image, {} dropped)", clamped, dropped);
  }
  return out;
}

bool check_box(float box[4], int64_t width, int64_t height, BadBoxPolicy policy, const std::string& where,
               BoxCounts* counts) {
  const auto W = static_cast<float>(width), H = static_cast<float>(height);
  const bool positive = box[2] > box[0] && box[3] > box[1];
  const bool inside = box[0] >= 0 && box[1] >= 0 && box[2] <= W && box[3] <= H;
  if (positive && inside) {
    ++counts->kept;
    return true;
  }
  if (policy == BadBoxPolicy::kRefuse) {
    throw bad_input("{}: the box (x1 {}, y1 {}, x2 {}, y2 {}) {} its image of {}x{} pixels (data.bad_boxes = "
                    "\"refuse\"; \"clamp\" clips such boxes to the image, \"drop\" leaves them out)",
                    where, box[0], box[1], box[2], box[3], positive ? "reaches outside" : "has no area in", width,
                    height);
  }
  if (policy == BadBoxPolicy::kDrop) {
    ++counts->dropped;
    return false;
  }
  // Clamp as ClampBoundingBoxes does, then keep what still has an area.
  box[0] = std::clamp(box[0], 0.0f, W), box[2] = std::clamp(box[2], 0.0f, W);
  box[1] = std::clamp(box[1], 0.0f, H), box[3] = std::clamp(box[3], 0.0f, H);
  if (!(box[2] > box[0] && box[3] > box[1])) {
    ++counts->dropped;
    return false;
  }
  ++counts->clamped;
  ++counts->kept;
  return true;
}

}  // namespace crucible::data
