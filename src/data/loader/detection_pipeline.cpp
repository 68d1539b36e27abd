// DetectionPipeline (see detection_pipeline.h).
#include "crucible/data/loader/detection_pipeline.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

#include "crucible/core/error.h"
#include "crucible/core/rng.h"
#include "crucible/data/image/decode.h"

namespace crucible::data {

DetectionPipeline::DetectionPipeline(std::shared_ptr<const SampleSource> source, DetectionPipelineOptions options)
    : source_(std::move(source)), opt_(std::move(options)) {
  if (source_ == nullptr || !source_->has_boxes()) {
    throw bad_input("{}: a detection pipeline needs a source whose samples carry boxes (a COCO file, a YOLO folder)",
                    source_ == nullptr ? std::string("no source") : source_->describe());
  }
  if (opt_.size_divisible < 1) throw bad_input("size_divisible = {}: expected at least 1", opt_.size_divisible);
  if ((opt_.fixed_width > 0) != (opt_.fixed_height > 0)) {
    throw std::logic_error("DetectionPipeline: a fixed size needs both a width and a height");
  }
}

ImageSpec DetectionPipeline::output_spec() const {
  ImageSpec s;
  s.height = opt_.fixed_height;
  s.width = opt_.fixed_width;
  s.channels = 3;
  s.order = opt_.order;
  return s;
}

int64_t DetectionPipeline::produce(int64_t, int64_t, uint8_t*) const {
  throw std::logic_error("DetectionPipeline::produce: a detection batch is built by produce_detection and collated");
}

DetectionBatchLayout DetectionPipeline::batch_layout() const {
  return {opt_.size_divisible, opt_.fixed_width, opt_.fixed_height, opt_.pad_value};
}

DetectionImage DetectionPipeline::decode(int64_t index, int64_t* image_id) const {
  const auto t0 = std::chrono::steady_clock::now();
  const EncodedSample e = source_->get(index);
  io_.read(static_cast<int64_t>(e.size), t0);
  DecodeOptions d;
  d.fast = opt_.fast_decode;
  d.dct_scaling = false;  // boxes are in the stored image's pixels
  d.exif_orientation = opt_.exif_orientation && source_->exif_orientation();
  DecodedImage img = decode_image(e.data, e.size, e.name, d);
  if (e.width > 0 && (img.width != e.width || img.height != e.height)) {
    throw bad_input("{}: the image is {}x{} pixels but its annotations say {}x{} (boxes would be misplaced)", e.name,
                    img.width, img.height, e.width, e.height);
  }
  DetectionImage s;
  s.width = img.width;
  s.height = img.height;
  s.channels = 3;
  s.pixels = std::move(img.pixels);
  if (e.boxes != nullptr) s.boxes = *e.boxes;
  if (image_id != nullptr) *image_id = e.image_id;
  return s;
}

DetectionImage DetectionPipeline::produce_detection(int64_t index, int64_t epoch, int64_t* image_id) const {
  DetectionImage s = decode(index, image_id);
  DetectionContext context;
  context.epoch = epoch & 0xffffffff;  // the epoch itself (draw_epoch adds a copy number above)
  context.size = source_->size();
  context.load = [this](int64_t i) { return decode(i, nullptr); };
  SampleRng rng(opt_.augment_seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
  for (const auto& t : opt_.transforms) t->apply(s, rng, context);
  if (opt_.fixed_width > 0 && (s.width != opt_.fixed_width || s.height != opt_.fixed_height)) {
    throw std::logic_error(fmt::format("detection preset {}: an image came out {}x{}, not the fixed {}x{}", opt_.preset,
                                       s.width, s.height, opt_.fixed_width, opt_.fixed_height));
  }
  if (opt_.order == ColorOrder::kBGR) {
    for (size_t i = 0; i + 2 < s.pixels.size(); i += 3) std::swap(s.pixels[i], s.pixels[i + 2]);
  }
  return s;
}

std::string DetectionPipeline::describe() const {
  std::string chain;
  for (const auto& t : opt_.transforms) chain += (chain.empty() ? "" : ", ") + t->describe();
  return fmt::format("{}; detection preset {}: {}; batches {}", source_->describe(), opt_.preset,
                     chain.empty() ? "no transforms" : chain,
                     opt_.fixed_width > 0 ? fmt::format("of {}x{} images", opt_.fixed_width, opt_.fixed_height)
                                          : fmt::format("padded to a multiple of {}", opt_.size_divisible));
}

}  // namespace crucible::data
