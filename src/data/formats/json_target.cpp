// Per-sample JSON detection targets (json_target.h), read with nlohmann::json.
#include "crucible/data/formats/json_target.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"

namespace crucible::data {
namespace {

nlohmann::json parse(const uint8_t* data, size_t size) {
  const auto* p = reinterpret_cast<const char*>(data);
  return nlohmann::json::parse(p, p + size, nullptr, /*allow_exceptions=*/false);
}

const char* type_of(const nlohmann::json& v) { return v.type_name(); }

// An integer-valued number (5 or 5.0, as some writers put them) in [lo, hi].
bool as_int(const nlohmann::json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(std::floor(d) == d) || d < -9.2e18 || d > 9.2e18) return false;
    *out = static_cast<int64_t>(d);
  } else {
    return false;
  }
  return *out >= lo && *out <= hi;
}

// The optional per-box list `key`: empty when absent; one integer per box in [lo, hi] otherwise.
std::vector<int64_t> per_box(const nlohmann::json& j, const char* key, size_t boxes, int64_t lo, int64_t hi,
                             const std::string& where, const char* what) {
  std::vector<int64_t> out;
  const auto it = j.find(key);
  if (it == j.end()) return out;
  if (!it->is_array() || it->size() != boxes) {
    throw bad_input("{}: \"{}\" should be a list of {} (one per box, {} boxes), found {}", where, key, what, boxes,
                    it->is_array() ? fmt::format("{} entries", it->size()) : std::string(type_of(*it)));
  }
  out.resize(boxes);
  for (size_t i = 0; i < boxes; ++i) {
    if (!as_int((*it)[i], lo, hi, &out[i])) {
      throw bad_input("{}: box {}: \"{}\" should be {}, found {}", where, i, key, what, (*it)[i].dump());
    }
  }
  return out;
}

int size_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) return 0;
  int64_t v = 0;
  if (!as_int(*it, 1, std::numeric_limits<int>::max(), &v)) {
    throw bad_input("{}: \"{}\" should be the image's {} in pixels (an integer >= 1), found {}", where, key, key,
                    it->dump());
  }
  return static_cast<int>(v);
}

}  // namespace

bool is_json_target(const uint8_t* data, size_t size) {
  const nlohmann::json j = parse(data, size);
  return j.is_object() && j.contains("boxes");
}

JsonTarget parse_json_target(const uint8_t* data, size_t size, const std::string& where, const BoxPolicy& policy,
                             int width, int height, int64_t classes, BoxCounts* counts) {
  const nlohmann::json j = parse(data, size);
  if (j.is_discarded()) {
    throw bad_input("{}: the target does not parse as JSON (expected an object like {{\"boxes\": [[x1, y1, x2, y2]], "
                    "\"labels\": [0]}})",
                    where);
  }
  if (!j.is_object() || !j.contains("boxes")) {
    throw bad_input("{}: expected a JSON object with \"boxes\" and \"labels\", found {}", where,
                    j.is_object() ? "an object without \"boxes\"" : type_of(j));
  }
  const nlohmann::json& boxes = j.at("boxes");
  if (!boxes.is_array()) throw bad_input("{}: \"boxes\" should be a list of [x1, y1, x2, y2], found {}", where, type_of(boxes));
  const size_t n = boxes.size();
  if (static_cast<int64_t>(n) > policy.max_boxes) {
    throw bad_input("{}: {} boxes, more than data.max_boxes = {} on one image (T16: memory grows with the boxes of one "
                    "image); raise data.max_boxes if they are real",
                    where, n, policy.max_boxes);
  }
  if (n > 0 && !j.contains("labels")) throw bad_input("{}: {} boxes but no \"labels\"", where, n);
  const int64_t max_label = classes > 0 ? classes - 1 : std::numeric_limits<int64_t>::max();
  const std::string label_what =
      classes > 0 ? fmt::format("a class index from 0 to {}", classes - 1) : std::string("a class index >= 0");
  const std::vector<int64_t> labels =
      n == 0 && !j.contains("labels") ? std::vector<int64_t>{} : per_box(j, "labels", n, 0, max_label, where, label_what.c_str());
  const std::vector<int64_t> crowd = per_box(j, "iscrowd", n, 0, 1, where, "0 or 1");
  const std::vector<int64_t> ids =
      per_box(j, "ids", n, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), where, "an integer");

  JsonTarget out;
  out.width = size_field(j, "width", where);
  out.height = size_field(j, "height", where);
  if (j.contains("image_id") && !as_int(j.at("image_id"), std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max(), &out.image_id)) {
    throw bad_input("{}: \"image_id\" should be an integer, found {}", where, j.at("image_id").dump());
  }
  const int W = out.width > 0 ? out.width : width, H = out.height > 0 ? out.height : height;
  auto result = std::make_shared<Boxes>();
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& b = boxes[i];
    float box[4];
    bool ok = b.is_array() && b.size() == 4;
    for (size_t k = 0; ok && k < 4; ++k) {
      ok = b[k].is_number() && std::isfinite(b[k].get<double>());
      if (ok) box[k] = static_cast<float>(b[k].get<double>());
    }
    if (!ok) throw bad_input("{}: box {} should be [x1, y1, x2, y2] (4 finite numbers), found {}", where, i, b.dump());
    const int64_t id = ids.empty() ? static_cast<int64_t>(i) : ids[i];
    if (W > 0 && H > 0) {
      const std::string what = ids.empty() ? fmt::format("{}: box {}", where, i) : fmt::format("{}: box {} (id {})", where, i, id);
      if (!check_box(box, W, H, policy.bad, what, counts)) continue;
    } else {
      ++counts->kept;
    }
    result->add(box[0], box[1], box[2], box[3], labels[i], !crowd.empty() && crowd[i] == 1, id);
  }
  out.boxes = std::move(result);
  return out;
}

std::string json_target(const Boxes& boxes, int64_t image_id, int width, int height) {
  nlohmann::json j;
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < boxes.size(); ++i) {
    // float → double is exact, and the shortest double that reads back is written: the float
    // comes back bit for bit.
    list.push_back({static_cast<double>(boxes.xyxy[4 * i]), static_cast<double>(boxes.xyxy[4 * i + 1]),
                    static_cast<double>(boxes.xyxy[4 * i + 2]), static_cast<double>(boxes.xyxy[4 * i + 3])});
  }
  j["boxes"] = std::move(list);
  j["labels"] = boxes.labels;
  std::vector<int> crowd(boxes.iscrowd.begin(), boxes.iscrowd.end());
  j["iscrowd"] = crowd;
  j["ids"] = boxes.ids;
  if (image_id >= 0) j["image_id"] = image_id;
  if (width > 0) j["width"] = width;
  if (height > 0) j["height"] = height;
  return j.dump();
}

}  // namespace crucible::data
