// Array files as a Source (data.dataset = "arrays"): features and labels from .npy, .npz or
// .safetensors files, read through the io layer. D13: the features stay in the file's memory
// map (an .npy file, a safetensors entry, a stored np.savez member) and a sample is read from
// the mapping, never copied whole into RAM; the exceptions (a deflated npz member, a big-endian
// or Fortran-order array) are stated by features_note(). Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/formats/source.h"
#include "crucible/io/array.h"

namespace crucible::data {

// A config value naming one array: "file.npy", or "file.npz:name" / "file.safetensors:name"
// for one of several. A value that exists as a file is taken whole (a colon in a file name).
struct ArrayRef {
  std::string path;
  std::string name;  // empty: the file's only array
};
ArrayRef parse_array_ref(const std::string& text);

// One array opened for reading: `name` picked (bad_input listing the file's names when it has
// none of that name), or the file's only array when no name is given (bad_input listing the
// names when it holds several).
struct OpenedArray {
  io::Array array;
  std::string where;    // "file.npy", "file.npz:x", "file.safetensors:x" (for messages)
  bool mapped = false;  // D13: the elements lie in the file's memory map
  std::string note;     // when not mapped: why, and how to keep it mapped
};
// Reads .npy, .npz or .safetensors (detected from the content, D12); other formats are
// bad_input. `memory_budget` bounds what a deflated npz member may inflate to (0: default).
OpenedArray open_array(const std::string& ref, uint64_t memory_budget = 0);

// Labelled samples over an array file. Features are uint8 images [n, height, width] or
// [n, height, width, channels] (channels-last, 1 or 3 channels) — pixels like IDX images —
// or float features [n, channels, height, width], [n, height, width] (1 channel) or [n, d]
// (as [d, 1, 1]) in float32 (float16, bfloat16 and float64 are converted to float32 sample by
// sample), which the model takes as they are. Labels are integer class indices [n], kept in
// RAM as int64, or multi-label targets [n, classes] (bool or integer 0/1, or float within 0–1),
// kept in RAM as float32 (label() is then -1). Immutable; thread-safe (const).
class ArraySource final : public Source {
 public:
  // Use load_array_source.
  ArraySource(OpenedArray features, int64_t n, std::vector<int64_t> labels, std::string labels_where,
              std::vector<float> targets = {}, int64_t target_width = 0);

  int64_t size() const override { return n_; }
  ImageSpec spec() const override { return spec_; }
  // Sample i as stored in the file (stored_dtype(); in the mapping when features_mapped()).
  const uint8_t* pixels(int64_t i) const override { return data_ + i * stored_sample_bytes_; }
  // spec()'s form: the stored bytes, or converted to float32 for float16/bfloat16/float64.
  void copy_sample(int64_t i, uint8_t* dst) const override;
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  int64_t num_classes() const override { return num_classes_; }
  std::string describe() const override;
  int64_t target_width() const override { return target_width_; }
  const float* targets(int64_t i) const override {
    return target_width_ > 0 ? targets_.data() + i * target_width_ : nullptr;
  }

  io::DType stored_dtype() const { return features_.array.dtype; }
  const std::vector<int64_t>& stored_shape() const { return features_.array.shape; }  // all samples in the file
  const std::string& features_where() const { return features_.where; }
  bool features_mapped() const { return features_.mapped; }  // D13
  const std::string& features_note() const { return features_.note; }

  // D4: what the values are, from the first `max_samples` samples: dtype, shape, min/max, and
  // for float features a warning when they look un-normalised (0-255 pixels, |x| > 20) or hold
  // NaN/Inf. `warning` is empty when nothing looks wrong.
  struct ValueReport {
    std::string info;
    std::string warning;
  };
  ValueReport value_report(int64_t max_samples = 1000) const;

 private:
  OpenedArray features_;
  int64_t n_ = 0;
  ImageSpec spec_;
  const uint8_t* data_ = nullptr;
  int64_t stored_sample_bytes_ = 0;
  std::vector<int64_t> labels_;
  std::string labels_where_;
  std::vector<float> targets_;  // [n, target_width_] multi-label targets; empty for class indices
  int64_t target_width_ = 0;
  int64_t num_classes_ = 0;
};

// Opens data.*_images / data.*_labels values (ArrayRef syntax). Throws bad_input naming the
// file(s) for: a features dtype or rank other than above, labels that are neither integers of
// shape [n] nor targets of shape [n, classes] (a target other than 0/1, or outside 0–1 for
// floats, names its sample and class), counts that differ (naming both files and counts), a negative label (naming its index),
// and `limit` above the sample count (naming `limit_name`). `limit` > 0 keeps the first
// `limit` samples; num_classes() is the largest kept label + 1.
std::unique_ptr<ArraySource> load_array_source(const std::string& features, const std::string& labels,
                                               int64_t limit = 0, const std::string& limit_name = "limit");

}  // namespace crucible::data
