// Transfer + device-side conversion of a uint8 batch into the model's input (law 3, D4):
// [batch, H, W, C] uint8 in 0–255 → [batch, C, H, W] float, (x/255 - mean) / std with
// mean/std stated in their units ("unit" = 0–1 like torchvision, or "byte" = 0–255), in the
// chosen memory format. Mismatched conventions are rejected when it is constructed. Float
// features (SampleType::kFeatures, [batch, C, H, W] float32) go to the device as they are:
// bit-equal, no normalisation (data.mean/data.std do not apply). Thread-safe after
// construction (const).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "crucible/data/image/image.h"
#include "crucible/data/loader/loader.h"

namespace crucible::data {

struct NormalizeOptions {
  std::vector<double> mean;  // one per channel (a single value is not spread over several channels)
  std::vector<double> std;
  ValueRange range = ValueRange::kUnit;  // the units mean/std are given in
  ColorOrder order = ColorOrder::kRGB;   // the channel order mean/std are listed in (3 channels)
};

// What DeviceInput hands the model (law 3): the channel count and order, and the
// normalisation applied, per channel, in 0–1 units and in the images' channel order.
struct InputConvention {
  int64_t channels = 0;
  ColorOrder order = ColorOrder::kGray;
  std::vector<double> mean, std;  // empty for float features (as_given)
  bool as_given = false;          // float features: no normalisation at all
  std::string describe() const;  // "1 channel (gray), normalised with mean [0.286] std [0.353] (0–1 units)"
};

class DeviceInput {
 public:
  // Throws bad_input when mean/std do not have one value per channel (D4: one value is not
  // spread over RGB), are listed in another channel order (D3), or look like the other unit
  // (D4: a 0–255 mean with range "unit", or a 0–1 mean with range "byte"); for float features
  // `normalize` is not used (nor checked).
  DeviceInput(const ImageSpec& spec, NormalizeOptions normalize, c10::Device device, bool channels_last);

  // [B, C, H, W] float32, normalised (features: as they are); a detection batch at its own padded
  // size (batch.spec's height and width).
  at::Tensor images(const Batch& batch) const;
  // D9: an allocator for the loader that puts batches in pinned host memory when the device is
  // a GPU (null on CPU: the heap is right there). The batch must outlive the copy.
  static std::function<PixelBuffer(size_t)> batch_allocator(c10::Device device);
  // The batch's targets on the device: [B] int64 class indices, or for multi-label data
  // (batch.target_width > 0) [B, classes] float32 0–1 targets.
  at::Tensor labels(const Batch& batch) const;
  // A detection batch's boxes on the device: [total, 4] float32 xyxy pixels, and their labels
  // ([total] int64) into `labels`; undefined tensors for a batch without boxes.
  at::Tensor boxes(const Batch& batch, at::Tensor* labels) const;
  std::string describe() const;
  InputConvention delivers() const;

 private:
  ImageSpec spec_;
  NormalizeOptions norm_;
  c10::Device device_;
  bool channels_last_;
  at::Tensor scale_, shift_;  // [1, C, 1, 1]: x * scale + shift == (x/255 - mean) / std
};

}  // namespace crucible::data
