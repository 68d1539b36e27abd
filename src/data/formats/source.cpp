// InMemorySource and the IDX loader.
#include "crucible/data/formats/source.h"

#include <algorithm>

#include "crucible/core/error.h"
#include "crucible/io/idx.h"

namespace crucible::data {

InMemorySource::InMemorySource(ImageSpec spec, std::vector<uint8_t> pixels, std::vector<int64_t> labels,
                               std::string description)
    : spec_(spec), pixels_(std::move(pixels)), labels_(std::move(labels)), description_(std::move(description)) {
  if (static_cast<int64_t>(pixels_.size()) != spec_.bytes() * size()) {
    throw std::logic_error("InMemorySource: pixel buffer does not match spec × count");
  }
  for (int64_t l : labels_) {
    if (l < 0) throw bad_input("{}: negative label {}", description_, l);
    num_classes_ = std::max(num_classes_, l + 1);
  }
}

std::unique_ptr<InMemorySource> load_idx_source(const std::string& images_path, const std::string& labels_path,
                                                int64_t limit, const std::string& limit_name) {
  io::IdxArray images = io::read_idx(images_path);
  io::IdxArray labels = io::read_idx(labels_path);
  if (images.dtype != io::DType::kU8 || (images.shape.size() != 3 && images.shape.size() != 4)) {
    throw bad_input("{}: expected uint8 images of shape [n, height, width] or [n, height, width, channels], found {} "
                    "with {} dimensions",
                    images_path, io::dtype_name(images.dtype), images.shape.size());
  }
  if (labels.dtype != io::DType::kU8 || labels.shape.size() != 1) {
    throw bad_input("{}: expected uint8 labels of shape [n], found {} with {} dimensions", labels_path,
                    io::dtype_name(labels.dtype), labels.shape.size());
  }
  if (images.shape[0] != labels.shape[0]) {
    throw bad_input("{} holds {} images but {} holds {} labels", images_path, images.shape[0], labels_path,
                    labels.shape[0]);
  }
  ImageSpec spec;
  spec.height = images.shape[1];
  spec.width = images.shape[2];
  spec.channels = images.shape.size() == 4 ? images.shape[3] : 1;
  if (spec.channels != 1 && spec.channels != 3) {
    throw bad_input("{}: expected 1 or 3 channels, found {}", images_path, spec.channels);
  }
  spec.order = spec.channels == 1 ? ColorOrder::kGray : ColorOrder::kRGB;
  spec.range = ValueRange::kByte;
  int64_t n = images.shape[0];
  if (limit > n) {
    throw bad_input("{} = {} but {} holds {} samples: ask for at most {}, or 0 for all", limit_name, limit, images_path,
                    n, n);
  }
  if (limit > 0) n = limit;
  images.data.resize(static_cast<size_t>(n * spec.bytes()));
  images.data.shrink_to_fit();
  std::vector<int64_t> y(labels.data.begin(), labels.data.begin() + n);
  return std::make_unique<InMemorySource>(spec, std::move(images.data), std::move(y),
                                          images_path + " + " + labels_path);
}

}  // namespace crucible::data
