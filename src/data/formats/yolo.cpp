// A YOLO label folder as a detection source (sample_source.h: open_yolo), laid out as
// ultralytics keeps one: …/images/<split>/x.jpg with …/labels/<split>/x.txt.
#include "crucible/data/formats/sample_source.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "format_util.h"
#include "crucible/data/image/decode.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

// ultralytics' img2label_paths: the last "/images/" of the path becomes "/labels/", the
// extension ".txt"; "" when the path has no "/images/".
std::string label_path(const std::string& image) {
  const size_t at = image.rfind("/images/");
  if (at == std::string::npos) return "";
  std::string out = image.substr(0, at) + "/labels/" + image.substr(at + 8);
  const size_t dot = out.rfind('.');
  const size_t slash = out.rfind('/');
  if (dot != std::string::npos && dot > slash) out.resize(dot);
  return out + ".txt";
}

// An absolute path without a trailing '/' (label_path looks for "/images/" in it).
std::string absolute(const std::string& path) {
  std::string out = fs::absolute(path).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// The labels folder of an images folder (absolute; "" when its path has no "images" part).
std::string labels_dir(const std::string& dir) {
  const std::string images = absolute(dir);
  return fs::path(label_path(images + "/x.jpg")).parent_path().string();
}

std::vector<std::string> split_ws(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    const size_t b = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > b) out.push_back(line.substr(b, i - b));
  }
  return out;
}

bool parse_float(const std::string& s, float* v) {
  try {
    size_t used = 0;
    *v = std::stof(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_class(const std::string& s, int64_t* v) {
  // "3" or "3.0" (some exporters write the class as a float)
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return true;
  float f = 0;
  if (!parse_float(s, &f) || f != static_cast<float>(static_cast<int64_t>(f))) return false;
  *v = static_cast<int64_t>(f);
  return true;
}

// Every image file below `dir`, by path.
void list_images(const std::string& dir, std::vector<std::string>* out) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2) && has_image_extension(it->path().filename().string())) {
      out->push_back(it->path().string());
    }
  }
  if (ec) throw bad_input("cannot list folder {}: {}", dir, ec.message());
  std::sort(out->begin(), out->end());
}

// classes.txt (one name per line) in the labels folder, the images folder or the set's root.
bool read_class_names(const std::string& images, const std::string& labels, std::vector<std::string>* names,
                      std::string* from) {
  const fs::path root = fs::path(labels).parent_path().parent_path();
  for (const fs::path& dir : {fs::path(labels), fs::path(images), root}) {
    const fs::path p = dir / "classes.txt";
    std::ifstream f(p);
    if (!f) continue;
    for (std::string line; std::getline(f, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) names->push_back(line);
    }
    *from = p.string();
    return true;
  }
  return false;
}

class YoloSource final : public SampleSource {
 public:
  YoloSource(const std::string& images, const SourceOptions& options) : images_dir_(absolute(images)) {
    labels_dir_ = labels_dir(images_dir_);
    std::error_code ec;
    if (!fs::is_directory(images_dir_, ec)) throw bad_input("YOLO images folder {} does not exist", images_dir_);
    if (labels_dir_.empty() || !fs::is_directory(labels_dir_, ec)) {
      throw bad_input("{}: a YOLO set's images are in …/images/<split> and its labels in …/labels/<split>; found no "
                      "labels folder{}",
                      images_dir_, labels_dir_.empty() ? " (the path has no \"images\" part)" : " " + labels_dir_);
    }
    list_images(images_dir_, &paths_);
    if (paths_.empty()) throw bad_input("YOLO images folder {} holds no image file", images_dir_);
    const bool named = read_class_names(images_dir_, labels_dir_, &classes_, &classes_from_);
    int64_t max_label = -1;
    sizes_.resize(paths_.size());
    boxes_.resize(paths_.size());
    for (size_t i = 0; i < paths_.size(); ++i) {
      FileBytes bytes = read_file_bytes(paths_[i]);
      const ImageInfo info = probe_image(bytes.data.get(), bytes.size, paths_[i]);
      sizes_[i] = {info.width, info.height};
      boxes_[i] = read_labels(label_path(paths_[i]), info.width, info.height, options.boxes, named, &max_label);
    }
    if (!named) {
      for (int64_t c = 0; c <= max_label; ++c) classes_.push_back(std::to_string(c));
    }
    if (classes_.empty()) throw bad_input("{}: no label names a class, and no classes.txt names them", labels_dir_);
    log_info("data: YOLO {}: {} images ({} without boxes: background), {} classes{}, {}", images_dir_, paths_.size(),
             std::count_if(boxes_.begin(), boxes_.end(), [](const auto& b) { return b->empty(); }), classes_.size(),
             named ? " from " + classes_from_ : std::string(" (numbered: no classes.txt)"), counts_.line());
  }

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }

  EncodedSample get(int64_t index) const override {
    const std::string& path = paths_.at(static_cast<size_t>(index));
    FileBytes bytes = read_file_bytes(path);
    EncodedSample s;
    s.data = bytes.data.get();
    s.size = bytes.size;
    s.hold = std::move(bytes.data);
    s.name = path;
    s.boxes = boxes_[static_cast<size_t>(index)];
    s.image_id = index;
    s.width = sizes_[static_cast<size_t>(index)].first;
    s.height = sizes_[static_cast<size_t>(index)].second;
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("YOLO {} (labels {}): {} images, {} classes, {}", images_dir_, labels_dir_, paths_.size(),
                       classes_.size(), counts_.line());
  }
  int files_per_read() const override { return 1; }
  bool has_boxes() const override { return true; }
  bool image_size(int64_t index, int* width, int* height) const override {
    *width = sizes_.at(static_cast<size_t>(index)).first;
    *height = sizes_.at(static_cast<size_t>(index)).second;
    return true;
  }
  BoxCounts box_counts() const override { return counts_; }

 private:
  std::shared_ptr<const Boxes> read_labels(const std::string& path, int width, int height, const BoxPolicy& policy,
                                           bool named, int64_t* max_label) {
    auto boxes = std::make_shared<Boxes>();
    std::ifstream f(path);
    if (!f) return boxes;  // no label file: a background image, as ultralytics reads it
    std::string line;
    for (int64_t n = 1; std::getline(f, line); ++n) {
      const std::vector<std::string> cols = split_ws(line);
      if (cols.empty()) continue;
      const std::string where = fmt::format("{}:{}", path, n);
      if (cols.size() != 5) {
        throw bad_input("{}: {} columns; a YOLO box line is \"class cx cy w h\" (5 columns, normalised to the image){}",
                        where, cols.size(), cols.size() > 5 ? " — segment polygons are not read" : "");
      }
      int64_t label = 0;
      float v[4];
      if (!parse_class(cols[0], &label) || label < 0) {
        throw bad_input("{}: class \"{}\" should be an integer >= 0", where, cols[0]);
      }
      for (int k = 0; k < 4; ++k) {
        if (!parse_float(cols[k + 1], &v[k])) throw bad_input("{}: \"{}\" is not a number", where, cols[k + 1]);
      }
      if (named && label >= static_cast<int64_t>(classes_.size())) {
        throw bad_input("{}: class {} but {} names {} classes (0 to {})", where, label, classes_from_, classes_.size(),
                        classes_.size() - 1);
      }
      // ultralytics' xywhn2xyxy in float32: x1 = w * (cx - bw / 2).
      const auto W = static_cast<float>(width), H = static_cast<float>(height);
      float box[4] = {W * (v[0] - v[2] / 2), H * (v[1] - v[3] / 2), W * (v[0] + v[2] / 2), H * (v[1] + v[3] / 2)};
      if (!check_box(box, width, height, policy.bad, where, &counts_)) continue;
      if (static_cast<int64_t>(boxes->size()) >= policy.max_boxes) {
        throw bad_input("{}: more than data.max_boxes = {} boxes on one image (T16: memory grows with the boxes of one "
                        "image); raise data.max_boxes if they are real",
                        path, policy.max_boxes);
      }
      *max_label = std::max(*max_label, label);
      boxes->add(box[0], box[1], box[2], box[3], label, false, n);
    }
    return boxes;
  }

  std::string images_dir_, labels_dir_, classes_from_;
  std::vector<std::string> paths_;
  std::vector<std::pair<int, int>> sizes_;
  std::vector<std::shared_ptr<const Boxes>> boxes_;
  std::vector<std::string> classes_;
  BoxCounts counts_;
};

}  // namespace

std::unique_ptr<SampleSource> open_yolo(const std::string& images_dir, const SourceOptions& options) {
  return std::make_unique<YoloSource>(images_dir, options);
}

namespace format_detail {
// A folder whose path has an "images" part, with the matching labels folder beside it. Asked
// before the image folder, which would take it for class sub-folders.
SampleFormat yolo_format() {
  return {"yolo", "a YOLO images folder (…/images/<split>, with …/labels/<split>)",
          [](const std::string& path, bool, bool is_dir) {
            if (!is_dir) return false;
            const std::string labels = labels_dir(path);
            std::error_code ec;
            return !labels.empty() && fs::is_directory(labels, ec);
          },
          open_yolo};
}
}  // namespace format_detail

}  // namespace crucible::data
