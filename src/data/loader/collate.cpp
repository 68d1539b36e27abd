// collate_detection (see collate.h).
#include "crucible/data/loader/collate.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace crucible::data {

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
      for (int64_t c = 0; c < C; ++c) {
        uint8_t* plane = dst + c * H * W;
        for (int y = 0; y < im.height; ++y) {
          const uint8_t* src = im.pixels.data() + y * row + c;
          uint8_t* out = plane + y * W;
          for (int x = 0; x < im.width; ++x) out[x] = src[x * C];
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
