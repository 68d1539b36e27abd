// ArrayPipeline and ImagePipeline.
#include "crucible/data/loader/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/rng.h"

namespace crucible::data {

DetectionImage SamplePipeline::produce_detection(int64_t, int64_t, int64_t*) const {
  throw std::logic_error("SamplePipeline::produce_detection: not a detection pipeline");
}

ArrayPipeline::ArrayPipeline(std::shared_ptr<const Source> source, SampleTransforms transforms, uint64_t augment_seed)
    : source_(std::move(source)), transforms_(std::move(transforms)), seed_(augment_seed) {
  // Float features are used as they are; a pixel transform would treat their bytes as pixels.
  if (!transforms_.empty() && source_->spec().type != SampleType::kPixels) {
    throw std::logic_error("ArrayPipeline: sample transforms of float features");
  }
}

int64_t ArrayPipeline::produce(int64_t index, int64_t epoch, uint8_t* dst) const {
  const auto t0 = std::chrono::steady_clock::now();
  source_->copy_sample(index, dst);
  io_.read(source_->spec().bytes(), t0);
  if (!transforms_.empty()) {
    const ImageSpec spec = source_->spec();
    SampleRng rng(seed_, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
    apply_transforms(transforms_, 0,
                     ImageRef{dst, static_cast<int>(spec.width), static_cast<int>(spec.height),
                              static_cast<int>(spec.channels), /*planar=*/false},
                     rng);
  }
  return source_->label(index);
}

void ArrayPipeline::copy_targets(int64_t index, float* dst) const {
  const float* t = source_->targets(index);
  std::copy(t, t + source_->target_width(), dst);
}

std::string ArrayPipeline::describe() const {
  return fmt::format("{} ({}), {}", source_->describe(), source_->spec().to_string(),
                     transforms_.empty() ? std::string("no transforms") : describe_transforms(transforms_));
}

// A cache entry: the encoded bytes, or the decoded full image.
struct ImagePipeline::Cached {
  std::vector<uint8_t> bytes;  // encoded bytes, or [h, w, 3] RGB
  int width = 0, height = 0;   // decoded only
  int64_t label = -1;
  std::string name;
};

const char* cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::kEncoded:
      return "encoded";
    case CacheMode::kDecoded:
      return "decoded";
    case CacheMode::kNone:
      break;
  }
  return "none";
}

ImagePipeline::ImagePipeline(std::shared_ptr<const SampleSource> source, ImagePipelineOptions options)
    : source_(std::move(source)), opt_(std::move(options)) {
  if (opt_.crop < 1) throw bad_input("data.crop must be >= 1, found {}", opt_.crop);
  if (!(opt_.center_fraction > 0.0 && opt_.center_fraction <= 1.0)) {
    throw bad_input("the evaluation centre-crop fraction must be in (0, 1], found {}", opt_.center_fraction);
  }
  if (opt_.resize != 0 && opt_.resize < opt_.crop) {
    throw bad_input("data.eval_resize = {} is smaller than the evaluation crop {}: the short side is resized to "
                    "data.eval_resize, then the centre crop is cut from it (set eval_resize >= eval_crop, or 0 for "
                    "int(crop / 0.875))",
                    opt_.resize, opt_.crop);
  }
  if (opt_.cache != CacheMode::kNone) cache_.resize(static_cast<size_t>(source_->size()));
}

ImageSpec ImagePipeline::output_spec() const {
  return ImageSpec{opt_.crop, opt_.crop, 3, opt_.order, ValueRange::kByte};
}

int ImagePipeline::files_needed(int threads) const {
  return source_->files_held() + threads * source_->files_per_read();
}

std::shared_ptr<const ImagePipeline::Cached> ImagePipeline::lookup(int64_t index) const {
  std::lock_guard<std::mutex> lock(cache_mu_[index % 64]);
  return cache_[static_cast<size_t>(index)];
}

void ImagePipeline::store(int64_t index, std::shared_ptr<const Cached> entry, int64_t bytes) const {
  // D1: the budget is checked before the bytes are kept; past it the sample is simply re-read.
  cache_offered_.fetch_add(bytes, std::memory_order_relaxed);
  if (cache_used_.fetch_add(bytes) + bytes > opt_.cache_bytes) {
    cache_used_.fetch_sub(bytes);
    return;
  }
  std::lock_guard<std::mutex> lock(cache_mu_[index % 64]);
  if (cache_[static_cast<size_t>(index)]) {
    cache_used_.fetch_sub(bytes);  // another thread cached it first
    return;
  }
  cache_[static_cast<size_t>(index)] = std::move(entry);
}

int64_t SamplePipeline::produce_channels_first(int64_t index, int64_t epoch, uint8_t* dst) const {
  const ImageSpec spec = output_spec();
  const size_t channels = static_cast<size_t>(spec.channels);
  if (channels == 1) return produce(index, epoch, dst);  // [h, w, 1] is [1, h, w]
  thread_local std::vector<uint8_t> hwc;
  hwc.resize(static_cast<size_t>(spec.bytes()));
  const int64_t label = produce(index, epoch, hwc.data());
  const size_t plane = static_cast<size_t>(spec.height * spec.width);
  for (size_t p = 0; p < plane; ++p) {
    for (size_t k = 0; k < channels; ++k) dst[k * plane + p] = hwc[p * channels + k];
  }
  return label;
}

int64_t ImagePipeline::produce(int64_t index, int64_t epoch, uint8_t* dst) const {
  return produce(index, epoch, dst, /*planar=*/false);
}

int64_t ImagePipeline::produce_channels_first(int64_t index, int64_t epoch, uint8_t* dst) const {
  return produce(index, epoch, dst, /*planar=*/true);
}

int64_t ImagePipeline::produce(int64_t index, int64_t epoch, uint8_t* dst, bool planar) const {
  const int crop = opt_.crop;
  std::shared_ptr<const Cached> cached = opt_.cache != CacheMode::kNone ? lookup(index) : nullptr;
  if (opt_.cache != CacheMode::kNone) cached ? io_.cache_hit() : io_.cache_miss();
  EncodedSample sample;
  if (!cached) {
    const auto t0 = std::chrono::steady_clock::now();
    sample = source_->get(index);
    io_.read(static_cast<int64_t>(sample.size), t0);
  }
  const std::string& name = cached ? cached->name : sample.name;
  const int64_t label = cached ? cached->label : sample.label;
  const uint8_t* data = cached ? cached->bytes.data() : sample.data;
  const size_t size = cached ? cached->bytes.size() : sample.size;

  if (opt_.cache == CacheMode::kEncoded && !cached) {
    auto e = std::make_shared<Cached>();
    e->bytes.assign(sample.data, sample.data + sample.size);
    e->label = sample.label;
    e->name = sample.name;
    store(index, e, static_cast<int64_t>(e->bytes.size() + name.size() + sizeof(Cached)));
  }

  SampleRng rng(opt_.augment_seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
  int width, height;
  std::shared_ptr<const Cached> decoded;
  if (opt_.cache == CacheMode::kDecoded) {
    decoded = cached;
    if (!decoded) {
      DecodeOptions full_options;
      full_options.fast = opt_.fast_decode;
      full_options.exif_orientation = opt_.exif_orientation;
      DecodedImage full = decode_image(data, size, name, full_options);
      decoded_pixels_.fetch_add(int64_t{full.width} * full.height, std::memory_order_relaxed);
      auto e = std::make_shared<Cached>();
      e->bytes = std::move(full.pixels);
      e->width = full.width;
      e->height = full.height;
      e->label = label;
      e->name = name;
      store(index, e, static_cast<int64_t>(e->bytes.size() + name.size() + sizeof(Cached)));
      decoded = e;
    }
    width = decoded->width;
    height = decoded->height;
  } else {
    const ImageInfo info = probe_image(data, size, name, opt_.exif_orientation);
    width = info.width;
    height = info.height;
  }
  if (width < 1 || height < 1) throw bad_input("{}: image has no pixels ({}x{})", name, width, height);
  thread_local std::vector<uint8_t> decode_storage;  // the crop's decode, reused (DecodeOptions::recycle)

  if (!opt_.train) {
    // torchvision's Resize(int(crop / fraction)) + CenterCrop(crop), literally: the whole image
    // resized (from the smallest DCT scale that still covers that size), then the crop copied.
    const ResizeCentreCrop rc = opt_.resize > 0 ? resize_centre_crop_to(width, height, opt_.resize, crop)
                                                : resize_centre_crop(width, height, crop, opt_.center_fraction);
    thread_local std::vector<uint8_t> resized;
    resized.resize(static_cast<size_t>(rc.resized_width) * rc.resized_height * 3);
    if (decoded) {
      resize_image(decoded->bytes.data(), width, height, width * 3, 3, resized.data(), rc.resized_width,
                   rc.resized_height, /*flip=*/false, planar);
    } else {
      DecodeOptions d;
      d.min_width = rc.resized_width;
      d.min_height = rc.resized_height;
      d.fast = opt_.fast_decode;
      d.dct_scaling = opt_.dct_scaling;
      d.exif_orientation = opt_.exif_orientation;
      d.padded_rows = true;
      d.recycle = &decode_storage;
      DecodedImage img = decode_image(data, size, name, d);
      decoded_pixels_.fetch_add(int64_t{img.width} * img.height, std::memory_order_relaxed);
      resize_image(img.data(), img.width, img.height, static_cast<int>(img.stride()), 3, resized.data(),
                   rc.resized_width, rc.resized_height, /*flip=*/false, planar);
      decode_storage.swap(img.pixels);
    }
    // The centre crop's rows: of each plane, or of the interleaved image (one "plane" of RGB).
    const size_t planes = planar ? 3 : 1, px = planar ? 1 : 3;
    const size_t in_plane = static_cast<size_t>(rc.resized_width) * rc.resized_height * px;
    const size_t out_plane = static_cast<size_t>(crop) * crop * px;
    for (size_t c = 0; c < planes; ++c) {
      for (int y = 0; y < crop; ++y) {
        std::memcpy(dst + c * out_plane + static_cast<size_t>(y) * crop * px,
                    resized.data() + c * in_plane + (static_cast<size_t>(rc.top + y) * rc.resized_width + rc.left) * px,
                    static_cast<size_t>(crop) * px);
      }
    }
  } else {
    const Rect region = random_resized_crop(width, height, rng, opt_.rrc);
    // A first transform that only mirrors is written by the resize itself (one pass less).
    bool flip = false;
    const size_t folded = !opt_.transforms.empty() && opt_.transforms[0]->fold_mirror(rng, &flip) ? 1 : 0;
    if (decoded) {
      const uint8_t* src = decoded->bytes.data() + (static_cast<size_t>(region.y) * width + region.x) * 3;
      resize_image(src, region.width, region.height, width * 3, 3, dst, crop, crop, flip, planar);
    } else {
      DecodeOptions d;
      d.region = region;
      d.min_width = crop;
      d.min_height = crop;
      d.fast = opt_.fast_decode;
      d.dct_scaling = opt_.dct_scaling;
      d.exif_orientation = opt_.exif_orientation;
      d.padded_rows = true;  // resized straight from libjpeg's rows
      d.recycle = &decode_storage;
      DecodedImage img = decode_image(data, size, name, d);
      decoded_pixels_.fetch_add(int64_t{img.width} * img.height, std::memory_order_relaxed);
      resize_image(img.data(), img.width, img.height, static_cast<int>(img.stride()), 3, dst, crop, crop, flip,
                   planar);
      decode_storage.swap(img.pixels);
    }
    apply_transforms(opt_.transforms, folded, ImageRef{dst, crop, crop, 3, planar}, rng);
  }
  if (opt_.order == ColorOrder::kBGR) {
    const size_t plane = static_cast<size_t>(crop) * crop;
    if (planar) {
      std::swap_ranges(dst, dst + plane, dst + 2 * plane);
    } else {
      for (size_t i = 0; i < plane; ++i) std::swap(dst[3 * i], dst[3 * i + 2]);
    }
  }
  return label;
}

std::string ImagePipeline::describe() const {
  return fmt::format("{}: {} {}x{} crops ({}), {}, {} JPEG decode, cache {}{}", source_->describe(),
                     opt_.train ? "RandomResizedCrop" : "resize + centre", opt_.crop, opt_.crop,
                     opt_.train ? fmt::format("scale {}–{}{}{}", opt_.rrc.scale_min, opt_.rrc.scale_max,
                                             opt_.transforms.empty() ? "" : ", ", describe_transforms(opt_.transforms))
                                : opt_.resize > 0 ? fmt::format("short side to {}, as torchvision's Resize({})", opt_.resize, opt_.resize)
                                : fmt::format("short side to int({} / {}) = {}, as torchvision", opt_.crop,
                                              opt_.center_fraction,
                                              static_cast<int>(opt_.crop / opt_.center_fraction)),
                     color_order_name(opt_.order),
                     fmt::format("{}{}{}", opt_.fast_decode ? "fast" : "accurate",
                                 opt_.dct_scaling ? ", DCT-scaled" : ", full-scale", opt_.exif_orientation ? "" : ", EXIF orientation ignored"),
                     cache_mode_name(opt_.cache), opt_.cache == CacheMode::kNone ? "" : fmt::format(" (budget {} MiB)", opt_.cache_bytes >> 20));
}

}  // namespace crucible::data
