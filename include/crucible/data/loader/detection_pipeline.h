// The per-sample pipeline of a detection set: read a sample with its boxes, decode the whole
// image, run the detection transforms (transforms/detection.h) drawing from the sample's own
// stream, and hand the image and its boxes to the loader, which pads a batch of them to a common
// size (collate_detection). Thread-safe (const).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/formats/sample_source.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/transforms/detection.h"

namespace crucible::data {

struct DetectionPipelineOptions {
  DetectionTransforms transforms;  // in order; the preset's training chain, or its evaluation chain
  std::string preset;              // what the log names ("hflip", "lsj", …)
  ColorOrder order = ColorOrder::kRGB;
  bool fast_decode = true;
  bool exif_orientation = true;  // and the source's own rule (SampleSource::exif_orientation)
  uint64_t augment_seed = 0;
  // The batch: each image padded at its bottom and right to the batch's largest height and width,
  // rounded up to a multiple of size_divisible (GeneralizedRCNNTransform's batching), with
  // pad_value; or, when fixed_width and fixed_height are set, every image is that size already
  // (a letterbox, FixedSizeCrop) and the batch is.
  int size_divisible = 32;
  int fixed_width = 0, fixed_height = 0;
  uint8_t pad_value = 0;
};

class DetectionPipeline final : public SamplePipeline {
 public:
  DetectionPipeline(std::shared_ptr<const SampleSource> source, DetectionPipelineOptions options);
  int64_t size() const override { return source_->size(); }
  // Height and width 0 unless fixed: a batch's size is its images'.
  ImageSpec output_spec() const override;
  int64_t produce(int64_t index, int64_t epoch, uint8_t* dst) const override;  // logic_error: see produce_detection
  bool detection() const override { return true; }
  DetectionImage produce_detection(int64_t index, int64_t epoch, int64_t* image_id) const override;
  DetectionBatchLayout batch_layout() const override;
  std::vector<int64_t> category_ids() const override { return source_->category_ids(); }
  std::vector<std::string> class_names() const override { return source_->classes(); }
  std::string describe() const override;
  int files_needed(int threads) const override { return threads * source_->files_per_read() + source_->files_held(); }
  void plan(const std::vector<int64_t>& upcoming) const override { source_->plan(upcoming); }
  bool remote_io(RemoteIo* out) const override { return source_->remote_io(out); }
  std::vector<int64_t> shard_counts() const override { return source_->shard_counts(); }
  const SampleSource& source() const { return *source_; }

 private:
  // Sample `index` read, decoded and checked against its annotations, before any transform.
  DetectionImage decode(int64_t index, int64_t* image_id) const;

  std::shared_ptr<const SampleSource> source_;
  DetectionPipelineOptions opt_;
};

}  // namespace crucible::data
