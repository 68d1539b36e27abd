// A COCO instances file as a detection source (sample_source.h: open_coco), read as
// torchvision's CocoDetection with wrap_dataset_for_transforms_v2 reads it.
#include "crucible/data/formats/sample_source.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;
using json = nlohmann::json;

// The file's JSON without the annotations' segmentation polygons and RLEs, which are most of a
// COCO file's bytes and which boxes do not need.
json parse_without_segmentation(const std::string& path) {
  const std::string raw = read_file(path);  // bad_input naming a missing file
  json::parser_callback_t drop = [](int depth, json::parse_event_t event, json& parsed) {
    return !(event == json::parse_event_t::key && depth == 3 && parsed == "segmentation");
  };
  try {
    return json::parse(raw, drop);
  } catch (const json::exception& e) {
    throw bad_input("{}: not JSON: {}", path, e.what());
  }
}

// `key` of `object` as T; bad_input naming `where` and the key when it is missing or of another type.
template <typename T>
T field(const json& object, const char* key, const std::string& where, const char* expected) {
  const auto it = object.find(key);
  if (it == object.end()) throw bad_input("{}: no \"{}\" ({} expected)", where, key, expected);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw bad_input("{}: \"{}\" is {} where {} was expected", where, key, it->dump().substr(0, 80), expected);
  }
}

class CocoSource final : public SampleSource {
 public:
  CocoSource(std::string path, const SourceOptions& options) : path_(std::move(path)) {
    const json j = parse_without_segmentation(path_);
    if (!j.is_object() || !j.contains("images") || !j.contains("annotations") || !j.contains("categories")) {
      throw bad_input("{}: a COCO instances file is an object with \"images\", \"annotations\" and \"categories\"; "
                      "this one has {}",
                      path_, j.is_object() ? fmt::format("the keys [{}]", keys(j)) : std::string("no object"));
    }
    read_categories(j.at("categories"));
    read_images(j.at("images"));
    read_annotations(j.at("annotations"), options.boxes);
    root_ = images_root(options.images_root);
    log_info("data: {}: {} images ({} without boxes: background), {} categories, {}", path_, images_.size(),
             std::count_if(images_.begin(), images_.end(), [](const Image& im) { return im.boxes->empty(); }),
             classes_.size(), counts_.line());
  }

  int64_t size() const override { return static_cast<int64_t>(images_.size()); }

  EncodedSample get(int64_t index) const override {
    const Image& im = images_.at(static_cast<size_t>(index));
    const std::string path = root_ + "/" + im.file;
    FileBytes bytes = read_file_bytes(path);  // names the path on failure
    EncodedSample s;
    s.data = bytes.data.get();
    s.size = bytes.size;
    s.hold = std::move(bytes.data);
    s.name = path;
    s.boxes = im.boxes;
    s.image_id = im.id;
    s.width = im.width;
    s.height = im.height;
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("COCO {} (images in {}): {} images, {} categories, {}", path_, root_, images_.size(),
                       classes_.size(), counts_.line());
  }
  int files_per_read() const override { return 1; }
  bool has_boxes() const override { return true; }
  std::vector<int64_t> category_ids() const override { return category_ids_; }
  bool image_size(int64_t index, int* width, int* height) const override {
    const Image& im = images_.at(static_cast<size_t>(index));
    *width = im.width;
    *height = im.height;
    return true;
  }
  BoxCounts box_counts() const override { return counts_; }
  bool exif_orientation() const override { return false; }  // COCO's boxes are in the stored pixels

 private:
  struct Image {
    int64_t id = 0;
    std::string file;
    int width = 0, height = 0;
    std::shared_ptr<Boxes> boxes;
  };

  static std::string keys(const json& j) {
    std::string out;
    for (const auto& [k, v] : j.items()) out += (out.empty() ? "\"" : ", \"") + k + "\"";
    return out;
  }

  void read_categories(const json& list) {
    if (!list.is_array()) throw bad_input("{}: \"categories\" should be a list", path_);
    std::map<int64_t, std::string> by_id;  // sorted: labels 0 … K-1 in category id order
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("{}: categories[{}]", path_, i);
      const auto id = field<int64_t>(list[i], "id", where, "an integer id");
      const auto name = field<std::string>(list[i], "name", where, "a name");
      if (!by_id.emplace(id, name).second) throw bad_input("{}: category id {} is listed twice", where, id);
    }
    if (by_id.empty()) throw bad_input("{}: \"categories\" is empty: a detection set needs at least one", path_);
    for (const auto& [id, name] : by_id) {
      label_of_.emplace(id, static_cast<int64_t>(classes_.size()));
      category_ids_.push_back(id);
      classes_.push_back(name);
    }
  }

  void read_images(const json& list) {
    if (!list.is_array()) throw bad_input("{}: \"images\" should be a list", path_);
    images_.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("{}: images[{}]", path_, i);
      Image im;
      im.id = field<int64_t>(list[i], "id", where, "an integer id");
      im.file = field<std::string>(list[i], "file_name", where, "a file name");
      im.width = field<int>(list[i], "width", where, "a width in pixels");
      im.height = field<int>(list[i], "height", where, "a height in pixels");
      if (im.width < 1 || im.height < 1) {
        throw bad_input("{} (id {}, {}): size {}x{}: expected a width and height of at least 1", where, im.id, im.file,
                        im.width, im.height);
      }
      im.boxes = std::make_shared<Boxes>();
      images_.push_back(std::move(im));
    }
    // CocoDetection's order: sorted(coco.imgs.keys()).
    std::sort(images_.begin(), images_.end(), [](const Image& a, const Image& b) { return a.id < b.id; });
    for (size_t i = 0; i < images_.size(); ++i) {
      if (!index_of_.emplace(images_[i].id, i).second) {
        throw bad_input("{}: image id {} is listed twice ({} and {})", path_, images_[i].id, images_[i - 1].file,
                        images_[i].file);
      }
    }
    if (images_.empty()) throw bad_input("{}: \"images\" is empty", path_);
  }

  void read_annotations(const json& list, const BoxPolicy& policy) {
    if (!list.is_array()) throw bad_input("{}: \"annotations\" should be a list", path_);
    for (size_t i = 0; i < list.size(); ++i) {
      const json& a = list[i];
      const std::string at = fmt::format("{}: annotations[{}]", path_, i);
      const auto id = field<int64_t>(a, "id", at, "an integer id");
      const std::string where = fmt::format("{}: annotation {}", path_, id);
      const auto image_id = field<int64_t>(a, "image_id", where, "an image id");
      const auto category = field<int64_t>(a, "category_id", where, "a category id");
      const auto bbox = field<std::vector<double>>(a, "bbox", where, "a box [x, y, width, height]");
      const int64_t crowd = a.contains("iscrowd") ? field<int64_t>(a, "iscrowd", where, "0 or 1") : 0;
      const auto image = index_of_.find(image_id);
      if (image == index_of_.end()) {
        throw bad_input("{}: its image_id {} is not among the file's {} images", where, image_id, images_.size());
      }
      const auto label = label_of_.find(category);
      if (label == label_of_.end()) {
        throw bad_input("{}: its category_id {} is not among the file's categories (ids {})", where, category,
                        fmt::join(category_ids_, ", "));
      }
      if (bbox.size() != 4) throw bad_input("{}: bbox has {} numbers; expected [x, y, width, height]", where, bbox.size());
      if (crowd != 0 && crowd != 1) throw bad_input("{}: iscrowd is {}; expected 0 or 1", where, crowd);
      Image& im = images_[image->second];
      // tv_tensors' XYWH → XYXY in float32: x2 = x + w.
      float box[4] = {static_cast<float>(bbox[0]), static_cast<float>(bbox[1]), 0, 0};
      box[2] = box[0] + static_cast<float>(bbox[2]);
      box[3] = box[1] + static_cast<float>(bbox[3]);
      const std::string what = fmt::format("{} (image {}, {}; bbox [{}, {}, {}, {}])", where, im.id, im.file, bbox[0],
                                           bbox[1], bbox[2], bbox[3]);
      if (!check_box(box, im.width, im.height, policy.bad, what, &counts_)) continue;
      if (static_cast<int64_t>(im.boxes->size()) >= policy.max_boxes) {
        throw bad_input("{}: image {} ({}) has more than data.max_boxes = {} boxes (T16: memory grows with the boxes "
                        "of one image); raise data.max_boxes if they are real",
                        path_, im.id, im.file, policy.max_boxes);
      }
      im.boxes->add(box[0], box[1], box[2], box[3], label->second, crowd == 1, id);
    }
  }

  // Where the images are: `asked`, else beside the file, else COCO's layout
  // (annotations/instances_val2017.json → val2017/): the first that holds the first image.
  std::string images_root(const std::string& asked) const {
    if (!asked.empty()) return asked;
    const fs::path file(path_);
    const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
    std::vector<std::string> tried = {dir.string()};
    const std::string stem = file.stem().string();
    if (stem.rfind("instances_", 0) == 0) tried.push_back((dir.parent_path() / stem.substr(10)).string());
    std::error_code ec;
    for (const auto& root : tried) {
      if (fs::is_regular_file(root + "/" + images_.front().file, ec)) return root;
    }
    throw bad_input("{}: its first image {} is in none of [{}]; set data.images_root to the folder its file_names are "
                    "relative to",
                    path_, images_.front().file, fmt::join(tried, ", "));
  }

  std::string path_;
  std::string root_;
  std::vector<Image> images_;
  std::unordered_map<int64_t, size_t> index_of_;
  std::unordered_map<int64_t, int64_t> label_of_;
  std::vector<int64_t> category_ids_;
  std::vector<std::string> classes_;
  BoxCounts counts_;
};

}  // namespace

std::unique_ptr<SampleSource> open_coco(const std::string& json_path, const SourceOptions& options) {
  return std::make_unique<CocoSource>(json_path, options);
}

namespace format_detail {
// A .json file (a COCO instances file; open_coco says what it lacks when it is another JSON).
SampleFormat coco_format() {
  return {"coco", "a COCO instances .json",
          [](const std::string& path, bool exists, bool is_dir) {
            return exists && !is_dir && ends_with(lower_ascii(path), ".json");
          },
          open_coco};
}
}  // namespace format_detail

}  // namespace crucible::data
