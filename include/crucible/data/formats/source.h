// Sources give random access to labelled samples by index: fixed-size uint8 images held in
// RAM (Fashion-MNIST from its IDX files), or samples of an array file (array_source.h).
// Thread-safe: all const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/image/image.h"

namespace crucible::data {

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  virtual ImageSpec spec() const = 0;
  // [height, width, channels] uint8 pixels of sample i (0 <= i < size()); valid while the
  // source lives. A source of another element type returns the sample as it stores it.
  virtual const uint8_t* pixels(int64_t i) const = 0;
  // Writes sample i in spec()'s form (spec().bytes() bytes) to `dst`: its pixels, or its
  // float32 features ([channels, height, width]) converted from the stored type.
  virtual void copy_sample(int64_t i, uint8_t* dst) const {
    std::memcpy(dst, pixels(i), static_cast<size_t>(spec().bytes()));
  }
  // Sample i's class index; -1 for multi-label data (target_width() > 0).
  virtual int64_t label(int64_t i) const = 0;
  virtual int64_t num_classes() const = 0;
  virtual std::string describe() const = 0;
  // Multi-label data: the number of 0–1 targets of each sample (one per class), 0 when each
  // sample has one class index instead.
  virtual int64_t target_width() const { return 0; }
  // The [target_width()] float targets of sample i (1 = the class is present), valid while the
  // source lives; nullptr when target_width() is 0.
  virtual const float* targets(int64_t i) const { return nullptr; }
};

// Images and labels in RAM.
class InMemorySource final : public Source {
 public:
  // `pixels` is [n, spec.height, spec.width, spec.channels]; labels are in [0, num_classes).
  InMemorySource(ImageSpec spec, std::vector<uint8_t> pixels, std::vector<int64_t> labels, std::string description);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  ImageSpec spec() const override { return spec_; }
  const uint8_t* pixels(int64_t i) const override { return pixels_.data() + i * spec_.bytes(); }
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  int64_t num_classes() const override { return num_classes_; }
  std::string describe() const override { return description_; }

 private:
  ImageSpec spec_;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  int64_t num_classes_ = 0;
  std::string description_;
};

// Loads an (images, labels) pair of IDX files (gzip or plain), such as Fashion-MNIST's
// train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz. `limit` > 0 keeps the first
// `limit` samples. Throws bad_input when the files disagree (counts, types, ranks), and when
// `limit` is more than they hold (the message names `limit_name`, the config key that set it).
std::unique_ptr<InMemorySource> load_idx_source(const std::string& images_path, const std::string& labels_path,
                                                int64_t limit = 0, const std::string& limit_name = "limit");

}  // namespace crucible::data
