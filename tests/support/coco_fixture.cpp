#include "coco_fixture.h"

#include <fstream>
#include <random>

#include "crucible/data/image/decode.h"

namespace crucible::test {

using json = nlohmann::json;

void write_jpeg(const std::string& path, int width, int height, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (auto& v : rgb) v = static_cast<uint8_t>(gen());
  const std::vector<uint8_t> jpeg = data::encode_jpeg(rgb.data(), width, height, 90);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(jpeg.data()),
                                              static_cast<std::streamsize>(jpeg.size()));
}

std::string write_coco(const TempDir& dir, const std::vector<std::tuple<int64_t, int, int>>& images, json annotations,
                       json categories) {
  json j;
  j["images"] = json::array();
  for (const auto& [id, w, h] : images) {
    const std::string name = "img" + std::to_string(id) + ".jpg";
    write_jpeg(dir / name, w, h, static_cast<uint32_t>(id));
    j["images"].push_back({{"id", id}, {"file_name", name}, {"width", w}, {"height", h}});
  }
  j["annotations"] = std::move(annotations);
  j["categories"] = std::move(categories);
  const std::string path = dir / "instances.json";
  std::ofstream(path) << j.dump();
  return path;
}

json ann(int64_t id, int64_t image, int64_t category, std::vector<double> bbox, int crowd) {
  const double area = bbox.size() == 4 ? bbox[2] * bbox[3] : 0.0;
  return {{"id", id},     {"image_id", image}, {"category_id", category}, {"bbox", bbox},
          {"iscrowd", crowd}, {"area", area}, {"segmentation", json::array({json::array({1, 2, 3, 4, 5, 6})})}};
}

}  // namespace crucible::test
