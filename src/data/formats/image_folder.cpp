// An image folder with torchvision ImageFolder order (sample_source.h: open_image_folder).
#include "crucible/data/formats/sample_source.h"

#include <algorithm>
#include <filesystem>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

// One folder's entries as os.walk(followlinks=True) splits them: sub-folders (symlinks to
// folders included) and everything else.
void list_folder(const std::string& dir, std::vector<std::string>* dirs, std::vector<std::string>* files) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw bad_input("cannot list folder {}: {}", dir, ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    const bool is_dir = it->is_directory(ec2);
    (is_dir ? dirs : files)->push_back(it->path().filename().string());
  }
  if (ec) throw bad_input("cannot list folder {}: {}", dir, ec.message());
}

class ImageFolderSource final : public SampleSource {
 public:
  explicit ImageFolderSource(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    std::error_code ec;
    if (!fs::exists(root_, ec)) throw bad_input("image folder {} does not exist", root_);
    if (!fs::is_directory(root_, ec)) throw bad_input("{} is not a folder (expected an image folder)", root_);
    std::vector<std::string> top_files;
    list_folder(root_, &classes_, &top_files);
    if (classes_.empty()) {
      if (top_files.empty()) throw bad_input("image folder {} is empty: expected one sub-folder per class", root_);
      throw bad_input("image folder {} holds {} files but no class sub-folders: expected one sub-folder per class",
                      root_, top_files.size());
    }
    std::sort(classes_.begin(), classes_.end());  // byte order, as Python's sorted() on names
    std::vector<std::string> empty;
    for (size_t c = 0; c < classes_.size(); ++c) {
      const size_t before = paths_.size();
      add_class(root_ + "/" + classes_[c], static_cast<int64_t>(c));
      if (paths_.size() == before) empty.push_back(classes_[c]);
    }
    if (!empty.empty()) {
      // torchvision refuses such a folder too (FileNotFoundError): the labels would mislead.
      std::string list;
      for (const auto& e : empty) list += (list.empty() ? "" : ", ") + e;
      throw bad_input("image folder {}: no image file in the class folders {}; expected files ending in .jpg .jpeg "
                      ".png .ppm .bmp .pgm .tif .tiff .webp (any case)",
                      root_, list);
    }
  }

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }

  EncodedSample get(int64_t index) const override {
    const std::string& path = paths_.at(static_cast<size_t>(index));
    FileBytes bytes = read_file_bytes(path);  // names the path on failure
    EncodedSample s;
    s.data = bytes.data.get();
    s.size = bytes.size;
    s.hold = std::move(bytes.data);
    s.label = labels_[static_cast<size_t>(index)];
    s.name = path;
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("image folder {}: {} samples in {} classes", root_, paths_.size(), classes_.size());
  }
  int files_per_read() const override { return 1; }  // D6: get() opens, reads, closes

 private:
  // torchvision: `for root, _, fnames in sorted(os.walk(dir, followlinks=True))` then
  // `sorted(fnames)`: every folder below the class folder, ordered by its whole path string
  // (so "a-x" comes before "a/b"), each contributing its own files in name order.
  void add_class(const std::string& class_dir, int64_t label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    std::vector<std::string> stack = {class_dir};
    while (!stack.empty()) {
      std::string dir = std::move(stack.back());
      stack.pop_back();
      std::vector<std::string> dirs, files;
      list_folder(dir, &dirs, &files);
      for (const auto& d : dirs) stack.push_back(dir + "/" + d);
      folders.emplace_back(std::move(dir), std::move(files));
    }
    std::sort(folders.begin(), folders.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [dir, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        if (!has_image_extension(f)) continue;
        paths_.push_back(dir + "/" + f);
        labels_.push_back(label);
      }
    }
  }

  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
};

}  // namespace

std::unique_ptr<SampleSource> open_image_folder(const std::string& root) {
  return std::make_unique<ImageFolderSource>(root);
}

namespace format_detail {
// A folder with at least one sub-folder: asked last, as anything else may be a folder too.
SampleFormat image_folder_format() {
  return {"images", "an image folder with one sub-folder per class",
          [](const std::string& path, bool, bool is_dir) {
            if (!is_dir) return false;
            std::error_code ec;
            for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
              std::error_code ec2;
              if (it->is_directory(ec2)) return true;
            }
            return false;
          },
          [](const std::string& path, const SourceOptions&) { return open_image_folder(path); }};
}
}  // namespace format_detail

}  // namespace crucible::data
