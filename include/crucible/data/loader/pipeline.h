// What the Loader runs for one sample: a SamplePipeline writes sample `index` of `epoch` into
// its slot of the batch, as fixed-size [height, width, channels] uint8 pixels, drawing any
// randomness from the sample's own stream (seed, epoch, index) so the result never depends on
// which thread runs it (law 1). Two pipelines: fixed-size images held in RAM (IDX), and
// encoded images (JPEG/PNG/raw) decoded, cropped, resized and flipped. Thread-safe (const),
// except the cache fill, which is internally synchronised.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "crucible/data/image/image.h"
#include "crucible/data/loader/io_stats.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/transforms/sample_transform.h"
#include "crucible/data/formats/source.h"
#include "crucible/data/transforms/detection.h"
#include "crucible/data/transforms/transform.h"

namespace crucible::data {

// How a detection pipeline's images make a batch (collate.h): padded at the bottom and right to
// the batch's largest height and width, rounded up to a multiple of size_divisible; or all of
// one fixed size. pad_value fills the padding.
struct DetectionBatchLayout {
  int size_divisible = 32;
  int fixed_width = 0, fixed_height = 0;
  uint8_t pad_value = 0;
};

class SamplePipeline {
 public:
  virtual ~SamplePipeline() = default;
  virtual int64_t size() const = 0;
  virtual ImageSpec output_spec() const = 0;
  // Writes sample `index` as seen in `epoch` into `dst` (output_spec().bytes() bytes) and
  // returns its label. Throws crucible::Error (bad input) naming the sample when it cannot be
  // read or decoded (D5); the loader's policy decides to skip or fail.
  virtual int64_t produce(int64_t index, int64_t epoch, uint8_t* dst) const = 0;
  // As produce, but [channels, height, width] (uint8 pixels, for a channels-first batch). This
  // default transposes produce()'s output; a pipeline that can write planes directly overrides it.
  virtual int64_t produce_channels_first(int64_t index, int64_t epoch, uint8_t* dst) const;
  virtual std::string describe() const = 0;
  // D6: file descriptors needed with `threads` workers reading at once.
  virtual int files_needed(int threads) const { return 0; }
  // Passed to the sample source (SampleSource::plan): the indices the loader reads next.
  virtual void plan(const std::vector<int64_t>& upcoming) const {}
  // SampleSource::remote_io, for the D11 report.
  virtual bool remote_io(RemoteIo* out) const { return false; }
  // SampleSource::shard_counts, for the global order's shuffle windows.
  virtual std::vector<int64_t> shard_counts() const { return {}; }
  // Multi-label data (Source::target_width): targets per sample, 0 for a class index; and
  // sample `index`'s targets into `dst` ([target_width()] floats).
  virtual int64_t target_width() const { return 0; }
  virtual void copy_targets(int64_t index, float* dst) const {}
  // Detection (detection_pipeline.h): samples of their own sizes with boxes, which the loader
  // collates (collate.h) instead of calling produce(). produce_detection gives sample `index` as
  // seen in `epoch` and its image id in the source; bad input as produce() throws it.
  virtual bool detection() const { return false; }
  virtual DetectionImage produce_detection(int64_t index, int64_t epoch, int64_t* image_id) const;
  virtual DetectionBatchLayout batch_layout() const { return {}; }
  // SampleSource::category_ids and classes: each label's id in the source (COCO's category ids),
  // and its name; empty when the pipeline does not say.
  virtual std::vector<int64_t> category_ids() const { return {}; }
  virtual std::vector<std::string> class_names() const { return {}; }
  // D11: the reads and cache lookups of every produce() so far.
  IoSnapshot io() const { return io_.snapshot(); }
  // The RAM cache (data.cache): "none", "encoded" or "decoded", its budget and what it holds.
  virtual const char* cache_name() const { return "none"; }
  virtual int64_t cache_budget_bytes() const { return 0; }
  virtual int64_t cache_held_bytes() const { return 0; }
  // Bytes every sample offered to the cache would take, kept or not (past the budget): what the
  // whole split needs, measured without the budget's bias towards the small samples.
  virtual int64_t cache_offered_bytes() const { return 0; }

 protected:
  mutable IoCounters io_;
};

// Fixed-size samples of a Source (IDX images in RAM, array files mapped), with the sample
// transforms applied to uint8 images; float features are copied as they are (no transforms).
class ArrayPipeline final : public SamplePipeline {
 public:
  ArrayPipeline(std::shared_ptr<const Source> source, SampleTransforms transforms, uint64_t augment_seed);
  int64_t size() const override { return source_->size(); }
  ImageSpec output_spec() const override { return source_->spec(); }
  int64_t produce(int64_t index, int64_t epoch, uint8_t* dst) const override;
  std::string describe() const override;
  int64_t target_width() const override { return source_->target_width(); }
  void copy_targets(int64_t index, float* dst) const override;

 private:
  std::shared_ptr<const Source> source_;
  SampleTransforms transforms_;
  uint64_t seed_;
};

// D1: what ImagePipeline keeps in RAM. kEncoded holds the file bytes (same pixels as kNone);
// kDecoded holds full-resolution RGB (crops then resize from full resolution rather than
// DCT-scale, so pixels differ slightly from kNone, and are the same for hits and misses).
enum class CacheMode { kNone, kEncoded, kDecoded };
const char* cache_mode_name(CacheMode mode);  // "none" | "encoded" | "decoded"

struct ImagePipelineOptions {
  int crop = 224;             // output is crop × crop
  bool train = true;          // RandomResizedCrop + transforms; false: resize + centre crop, no transforms
  RandomResizedCropOptions rrc;
  // Evaluation: torchvision's Resize(int(crop / center_fraction)) + CenterCrop(crop) (for crop
  // 224: Resize(256) + CenterCrop(224)), see resize_centre_crop.
  double center_fraction = 0.875;
  int resize = 0;  // evaluation: Resize(resize) + CenterCrop(crop) instead, when > 0 (FixRes); >= crop
  SampleTransforms transforms;  // training: after the crop and resize, in order (a flip first is folded in)
  CacheMode cache = CacheMode::kNone;  // D1
  int64_t cache_bytes = 0;     // budget of the cache; samples past it are not cached
  ColorOrder order = ColorOrder::kRGB;  // D3: BGR only when asked for
  bool fast_decode = true;  // DecodeOptions::fast for JPEG (data.jpeg_decode = "fast" | "accurate")
  bool dct_scaling = true;       // DecodeOptions::dct_scaling (data.jpeg_dct_scaling)
  bool exif_orientation = true;  // DecodeOptions::exif_orientation (data.exif_orientation)
  uint64_t augment_seed = 0;
};

// Encoded samples. Training: decode only the crop at the smallest sufficient DCT scale (D2),
// resize to crop × crop with an antialiased filter, then the sample transforms. Evaluation: decode the whole image at
// the smallest DCT scale that covers torchvision's Resize, resize, centre-crop. In the requested
// channel order.
class ImagePipeline final : public SamplePipeline {
 public:
  // Throws bad_input for an unknown cache kind or a crop < 1.
  ImagePipeline(std::shared_ptr<const SampleSource> source, ImagePipelineOptions options);
  int64_t size() const override { return source_->size(); }
  ImageSpec output_spec() const override;
  int64_t produce(int64_t index, int64_t epoch, uint8_t* dst) const override;
  // Planes straight from the resize: no second pass over the pixels.
  int64_t produce_channels_first(int64_t index, int64_t epoch, uint8_t* dst) const override;
  std::string describe() const override;
  int files_needed(int threads) const override;
  void plan(const std::vector<int64_t>& upcoming) const override { source_->plan(upcoming); }
  bool remote_io(RemoteIo* out) const override { return source_->remote_io(out); }
  std::vector<int64_t> shard_counts() const override { return source_->shard_counts(); }
  // Bytes held by the cache now.
  int64_t cached_bytes() const { return cache_used_.load(); }
  const char* cache_name() const override { return cache_mode_name(opt_.cache); }
  int64_t cache_budget_bytes() const override { return opt_.cache == CacheMode::kNone ? 0 : opt_.cache_bytes; }
  int64_t cache_held_bytes() const override { return cache_used_.load(); }
  int64_t cache_offered_bytes() const override { return cache_offered_.load(); }
  // Pixels the decoders have returned so far (width × height of each decode, at its DCT scale):
  // what D2 saves is visible here (a 512×384 JPEG evaluated at crop 32 decodes 64×48 pixels).
  int64_t decoded_pixels() const { return decoded_pixels_.load(std::memory_order_relaxed); }

 private:
  struct Cached;
  int64_t produce(int64_t index, int64_t epoch, uint8_t* dst, bool planar) const;
  std::shared_ptr<const Cached> lookup(int64_t index) const;
  void store(int64_t index, std::shared_ptr<const Cached> entry, int64_t bytes) const;

  std::shared_ptr<const SampleSource> source_;
  ImagePipelineOptions opt_;

  mutable std::vector<std::shared_ptr<const Cached>> cache_;  // guarded by cache_mu_ stripes
  mutable std::mutex cache_mu_[64];
  mutable std::atomic<int64_t> cache_used_{0};
  mutable std::atomic<int64_t> cache_offered_{0};
  mutable std::atomic<int64_t> decoded_pixels_{0};
};

}  // namespace crucible::data
