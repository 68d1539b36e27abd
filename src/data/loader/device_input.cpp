// DeviceInput: uint8 NHWC batch → normalised float NCHW on the device.
#include "crucible/data/loader/device_input.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"

namespace crucible::data {

DeviceInput::DeviceInput(const ImageSpec& spec, NormalizeOptions normalize, c10::Device device, bool channels_last)
    : spec_(spec), norm_(std::move(normalize)), device_(device), channels_last_(channels_last) {
  if (spec_.type == SampleType::kFeatures) return;  // used as they are: mean/std do not apply
  const size_t c = static_cast<size_t>(spec_.channels);
  // D4: one value per channel, always. A single value is not spread over the channels: the
  // default (Fashion-MNIST's gray mean) silently applied to RGB photos is the mistake this stops.
  if (norm_.mean.size() != c || norm_.std.size() != c) {
    const bool byte = norm_.range == ValueRange::kByte;
    const std::string example =
        c == 3 ? fmt::format(" (RGB photos, as torchvision's ImageNet models: data.mean = [{}], data.std = [{}])",
                             byte ? "123.675, 116.28, 103.53" : "0.485, 0.456, 0.406",
                             byte ? "58.395, 57.12, 57.375" : "0.229, 0.224, 0.225")
               : std::string();
    throw bad_input("data.mean has {} value(s) and data.std has {} but the images have {} channel(s) ({}): set "
                    "data.mean and data.std to {} value(s) each, one per channel in {} order, in {} units "
                    "(data.mean_std_range = \"{}\"){}",
                    norm_.mean.size(), norm_.std.size(), c, spec_.to_string(), c, color_order_name(spec_.order),
                    value_range_name(norm_.range), byte ? "byte" : "unit", example);
  }
  // D3: per-channel numbers for RGB applied to BGR pixels (or the reverse) silently swap channels.
  if (c == 3 && norm_.mean.size() == 3 && spec_.order != norm_.order) {
    throw bad_input("the images arrive in {} order but data.mean/data.std are listed in {} order; set "
                    "data.mean_std_order = \"{}\" after reordering them, or data.color_order = \"{}\"",
                    color_order_name(spec_.order), color_order_name(norm_.order), color_order_name(spec_.order),
                    color_order_name(norm_.order));
  }
  if (spec_.range != ValueRange::kByte) {
    throw bad_input("images must arrive as 0-255 uint8 pixels, found range {}", value_range_name(spec_.range));
  }
  // D4: numbers in the wrong units are the classic silent mistake; refuse them.
  const double max_mean = *std::max_element(norm_.mean.begin(), norm_.mean.end());
  const double max_std = *std::max_element(norm_.std.begin(), norm_.std.end());
  if (norm_.range == ValueRange::kUnit && (max_mean > 1.0 || max_std > 1.0)) {
    throw bad_input("data.mean = [{}], data.std = [{}] look like 0-255 values but data.mean_std_range = \"unit\" "
                    "(pixels/255); divide them by 255 or set data.mean_std_range = \"byte\"",
                    fmt::join(norm_.mean, ", "), fmt::join(norm_.std, ", "));
  }
  if (norm_.range == ValueRange::kByte && max_mean <= 1.0 && max_std <= 1.0) {
    throw bad_input("data.mean = [{}], data.std = [{}] look like 0-1 values but data.mean_std_range = \"byte\" "
                    "(0-255); multiply them by 255 or set data.mean_std_range = \"unit\"",
                    fmt::join(norm_.mean, ", "), fmt::join(norm_.std, ", "));
  }
  const double unit = norm_.range == ValueRange::kUnit ? 1.0 / 255.0 : 1.0;
  std::vector<float> scale(c), shift(c);
  for (size_t i = 0; i < c; ++i) {
    const double m = norm_.mean[i];
    const double s = norm_.std[i];
    scale[i] = static_cast<float>(unit / s);
    shift[i] = static_cast<float>(-m / s);
  }
  const int64_t ci = static_cast<int64_t>(c);
  scale_ = at::tensor(scale).view({1, ci, 1, 1}).to(device_);
  shift_ = at::tensor(shift).view({1, ci, 1, 1}).to(device_);
}

at::Tensor DeviceInput::images(const Batch& batch) const {
  const auto format = channels_last_ ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (spec_.type == SampleType::kFeatures) {
    // [B, C, H, W] float32 as stored, bit for bit. The tensor must own its values (the batch
    // buffer is recycled): a clone on the CPU, the copy to the device elsewhere.
    const at::Tensor host =
        at::from_blob(batch.pixels.data(), {batch.size(), spec_.channels, spec_.height, spec_.width}, at::kFloat);
    return device_.is_cpu() ? host.clone(format) : host.to(device_, /*non_blocking=*/true).contiguous(format);
  }
  // The batch outlives this call; from_blob does not copy, the conversion below does.
  const int64_t h = batch.detection ? batch.spec.height : spec_.height;
  const int64_t w = batch.detection ? batch.spec.width : spec_.width;
  at::Tensor x;
  if (batch.channels_first) {
    x = at::from_blob(batch.pixels.data(), {batch.size(), spec_.channels, h, w}, at::kByte)
            .to(device_, /*non_blocking=*/true);
  } else {  // NHWC memory = channels_last NCHW view
    x = at::from_blob(batch.pixels.data(), {batch.size(), h, w, spec_.channels}, at::kByte)
            .to(device_, /*non_blocking=*/true)
            .permute({0, 3, 1, 2});
  }
  x = x.to(at::kFloat).contiguous(format);
  return x.mul_(scale_).add_(shift_);
}

std::function<PixelBuffer(size_t)> DeviceInput::batch_allocator(c10::Device device) {
  if (device.is_cpu()) return nullptr;  // the loader's recycled heap buffers
  // D9: batches assembled straight into pinned host memory, so the copy above is asynchronous.
  return [](size_t bytes) {
    auto t = std::make_shared<at::Tensor>(
        at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
    return PixelBuffer(t->data_ptr<uint8_t>(), bytes, t);
  };
}

at::Tensor DeviceInput::labels(const Batch& batch) const {
  const at::Tensor host =
      batch.target_width > 0
          ? at::from_blob(const_cast<float*>(batch.targets.data()), {batch.size(), batch.target_width}, at::kFloat)
          : at::from_blob(const_cast<int64_t*>(batch.labels.data()), {batch.size()}, at::kLong);
  if (device_.is_cpu()) return host.clone();  // the batch's vector dies with the batch
  // D9: a blocking copy from the vector would wait for the stream every batch. Staged through
  // pinned memory, the copy is asynchronous; `pinned` goes back to torch's caching host
  // allocator when it dies here, and that allocator keeps the block from reuse until the copy
  // has run (it records an event on the stream for a non-blocking copy from pinned memory).
  at::Tensor pinned = at::empty(host.sizes(), host.options().pinned_memory(true));
  pinned.copy_(host);
  return pinned.to(device_, /*non_blocking=*/true);
}

namespace {

// A host vector on the device: cloned on the CPU (the batch's vector dies with it), staged through
// pinned memory on a GPU so that the copy is asynchronous (as labels() does).
at::Tensor to_device(at::Tensor host, c10::Device device) {
  if (device.is_cpu()) return host.clone();
  at::Tensor pinned = at::empty(host.sizes(), host.options().pinned_memory(true));
  pinned.copy_(host);
  return pinned.to(device, /*non_blocking=*/true);
}

}  // namespace

at::Tensor DeviceInput::boxes(const Batch& batch, at::Tensor* labels) const {
  if (!batch.detection) {
    *labels = at::Tensor();
    return at::Tensor();
  }
  const auto total = static_cast<int64_t>(batch.box_labels.size());
  *labels = to_device(at::from_blob(const_cast<int64_t*>(batch.box_labels.data()), {total}, at::kLong), device_);
  return to_device(at::from_blob(const_cast<float*>(batch.boxes.data()), {total, 4}, at::kFloat), device_);
}

InputConvention DeviceInput::delivers() const {
  InputConvention c;
  c.channels = spec_.channels;
  c.order = spec_.order;
  if (spec_.type == SampleType::kFeatures) {
    c.as_given = true;
    return c;
  }
  const double unit = norm_.range == ValueRange::kByte ? 1.0 / 255.0 : 1.0;
  for (int64_t i = 0; i < spec_.channels; ++i) {
    c.mean.push_back(norm_.mean[static_cast<size_t>(i)] * unit);
    c.std.push_back(norm_.std[static_cast<size_t>(i)] * unit);
  }
  return c;
}

std::string InputConvention::describe() const {
  if (as_given) {
    return fmt::format("{} channel{} ({}), float features used as they are (no normalisation)", channels,
                       channels == 1 ? "" : "s", color_order_name(order));
  }
  return fmt::format("{} channel{} ({}), normalised with mean [{}] std [{}] (0–1 units)", channels,
                     channels == 1 ? "" : "s", color_order_name(order), fmt::join(mean, ", "), fmt::join(std, ", "));
}

std::string DeviceInput::describe() const {
  if (spec_.type == SampleType::kFeatures) {
    return fmt::format("{} (data.mean/data.std not applied), {}", spec_.to_string(),
                       channels_last_ ? "channels_last" : "contiguous");
  }
  return fmt::format("uint8 {} → float (x/{} - [{}]) / [{}] ({} units), {}", spec_.to_string(),
                     norm_.range == ValueRange::kUnit ? "255" : "1", fmt::join(norm_.mean, ", "), fmt::join(norm_.std, ", "),
                     value_range_name(norm_.range), channels_last_ ? "channels_last" : "contiguous");
}

}  // namespace crucible::data
