// collate_detection (see collate.h).
#include "crucible/data/loader/collate.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace crucible::data {
namespace {

// pshufb masks splitting 16 RGB pixels (three 16-byte registers) into 16 bytes of one channel:
// masks[c][i] picks channel c's bytes from input register i (0x80: none).
struct SplitMasks {
  alignas(16) uint8_t m[3][3][16];
  SplitMasks() {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 3; ++i) {
        for (int x = 0; x < 16; ++x) {
          const int from = 3 * x + c;
          m[c][i][x] = from / 16 == i ? static_cast<uint8_t>(from % 16) : 0x80;
        }
      }
    }
  }
};

// One row of `width` RGB pixels into three planes, 16 pixels a step where the CPU has SSSE3.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("ssse3"))) int split_rgb_ssse3(const uint8_t* src, int width, uint8_t* planes[3]) {
  static const SplitMasks masks;
  int x = 0;
  for (; x + 16 <= width; x += 16) {
    const __m128i in[3] = {_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * x)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * x + 16)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * x + 32))};
    for (int c = 0; c < 3; ++c) {
      __m128i v = _mm_setzero_si128();
      for (int i = 0; i < 3; ++i) {
        v = _mm_or_si128(v, _mm_shuffle_epi8(in[i], _mm_load_si128(reinterpret_cast<const __m128i*>(masks.m[c][i]))));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[c] + x), v);
    }
  }
  return x;
}
#endif

void split_rgb(const uint8_t* src, int width, uint8_t* planes[3]) {
  int x = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool ssse3 = __builtin_cpu_supports("ssse3");
  if (ssse3) x = split_rgb_ssse3(src, width, planes);
#endif
  for (; x < width; ++x) {
    for (int c = 0; c < 3; ++c) planes[c][x] = src[3 * x + c];
  }
}

}  // namespace

void collate_detection(std::vector<DetectionImage>& images, const DetectionBatchLayout& layout, bool channels_first,
                       const std::function<PixelBuffer(size_t bytes)>& allocate, Batch* b) {
  int64_t H = layout.fixed_height, W = layout.fixed_width, C = 3;
  if (H == 0) {
    for (const auto& im : images) {
      H = std::max<int64_t>(H, im.height);
      W = std::max<int64_t>(W, im.width);
    }
    const int64_t d = std::max(1, layout.size_divisible);
    H = (H + d - 1) / d * d;
    W = (W + d - 1) / d * d;
  }
  if (!images.empty()) C = images.front().channels;
  b->spec.height = H;
  b->spec.width = W;
  b->spec.channels = C;
  b->channels_first = channels_first;
  const size_t slot = static_cast<size_t>(H * W * C);
  b->pixels = allocate(images.size() * slot);
  b->image_sizes.clear();
  b->boxes.clear();
  b->box_labels.clear();
  b->box_crowd.clear();
  b->box_offsets.assign(1, 0);
  for (size_t n = 0; n < images.size(); ++n) {
    const DetectionImage& im = images[n];
    if (im.height > H || im.width > W || im.channels != C) {
      throw std::logic_error("collate_detection: an image larger than its batch, or with other channels");
    }
    uint8_t* dst = b->pixels.data() + n * slot;
    const size_t row = static_cast<size_t>(im.width) * C;
    const uint8_t pad = layout.pad_value;
    // Each byte written once: the image's rows, the padding right of them and the rows below.
    if (!channels_first) {
      const size_t out_row = static_cast<size_t>(W) * C;
      for (int y = 0; y < im.height; ++y) {
        std::memcpy(dst + y * out_row, im.pixels.data() + y * row, row);
        std::memset(dst + y * out_row + row, pad, out_row - row);
      }
      std::memset(dst + im.height * out_row, pad, (H - im.height) * out_row);
    } else {
      for (int y = 0; y < im.height && C == 3; ++y) {  // RGB: the three planes' rows at once
        uint8_t* planes[3] = {dst + y * W, dst + H * W + y * W, dst + 2 * H * W + y * W};
        split_rgb(im.pixels.data() + y * row, im.width, planes);
      }
      for (int64_t c = 0; c < C; ++c) {
        uint8_t* plane = dst + c * H * W;
        for (int y = 0; y < im.height; ++y) {
          uint8_t* out = plane + y * W;
          if (C != 3) {
            const uint8_t* src = im.pixels.data() + y * row + c;
            for (int x = 0; x < im.width; ++x) out[x] = src[x * C];
          }
          std::memset(out + im.width, pad, W - im.width);
        }
        std::memset(plane + im.height * W, pad, (H - im.height) * W);
      }
    }
    b->image_sizes.push_back(im.height);
    b->image_sizes.push_back(im.width);
    b->boxes.insert(b->boxes.end(), im.boxes.xyxy.begin(), im.boxes.xyxy.end());
    b->box_labels.insert(b->box_labels.end(), im.boxes.labels.begin(), im.boxes.labels.end());
    b->box_crowd.insert(b->box_crowd.end(), im.boxes.iscrowd.begin(), im.boxes.iscrowd.end());
    b->box_offsets.push_back(static_cast<int64_t>(b->box_labels.size()));
  }
}

}  // namespace crucible::data
