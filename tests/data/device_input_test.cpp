// D4 / law 3: normalisation states its units and refuses numbers in the other unit; the
// result equals (x/255 - mean)/std in the requested memory format.
#include "crucible/data/loader/device_input.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::data {
namespace {

Batch make_batch() {
  Batch b;
  b.spec = ImageSpec{2, 2, 3, ColorOrder::kRGB, ValueRange::kByte};
  const uint8_t px[] = {0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  b.pixels = PixelBuffer::heap(sizeof(px));
  std::memcpy(b.pixels.data(), px, sizeof(px));
  b.labels = {3, 4};
  b.sample_ids = {0, 1};
  return b;
}

TEST(DeviceInput, NormalisesPerChannelInUnitUnits) {
  Batch b = make_batch();
  DeviceInput in(b.spec, {{0.5, 0.4, 0.3}, {0.2, 0.25, 0.5}, ValueRange::kUnit}, c10::kCPU, /*channels_last=*/true);
  at::Tensor x = in.images(b);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{2, 3, 2, 2}));
  EXPECT_TRUE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
  // sample 0, channel 1, pixel (0,0) is 255 → (1 - 0.4)/0.25
  EXPECT_NEAR(x[0][1][0][0].item<float>(), (1.0 - 0.4) / 0.25, 1e-5);
  at::Tensor ref = at::from_blob(b.pixels.data(), {2, 2, 2, 3}, at::kByte).permute({0, 3, 1, 2}).to(at::kFloat) / 255.0;
  ref = (ref - at::tensor({0.5, 0.4, 0.3}).view({1, 3, 1, 1})) / at::tensor({0.2, 0.25, 0.5}).view({1, 3, 1, 1});
  EXPECT_TRUE(at::allclose(x, ref.to(at::kFloat), 1e-5, 1e-5));
  const at::Tensor y = in.labels(b);
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2}));
  EXPECT_EQ(y.scalar_type(), at::kLong);
  b.labels = {7, 7};  // the tensor owns its copy: the batch's vector may be reused or die
  EXPECT_EQ(y[0].item<int64_t>(), 3);
  EXPECT_EQ(y[1].item<int64_t>(), 4);
}

TEST(DeviceInput, ByteUnitsGiveTheSameResult) {
  Batch b = make_batch();
  DeviceInput unit(b.spec, {{0.5, 0.4, 0.3}, {0.25, 0.2, 0.5}, ValueRange::kUnit}, c10::kCPU, false);
  DeviceInput byte(b.spec, {{127.5, 102.0, 76.5}, {63.75, 51.0, 127.5}, ValueRange::kByte}, c10::kCPU, false);
  EXPECT_TRUE(at::allclose(unit.images(b), byte.images(b), 1e-5, 1e-5));
}

TEST(DeviceInput, WrongUnitsAreRefusedD4) {
  ImageSpec s{2, 2, 3, ColorOrder::kRGB, ValueRange::kByte};
  try {
    DeviceInput(s, {{123.7, 116.3, 103.5}, {58.4, 57.1, 57.4}, ValueRange::kUnit}, c10::kCPU, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("look like 0-255 values"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceInput(s, {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}, ValueRange::kByte}, c10::kCPU, false), Error);
  EXPECT_THROW(DeviceInput(s, {{0.5, 0.5}, {0.2, 0.2}, ValueRange::kUnit}, c10::kCPU, false), Error);
  // D3: mean/std listed for BGR applied to RGB pixels.
  test::expect_bad_input(
      [&] { DeviceInput(s, {{0.4, 0.45, 0.5}, {0.2, 0.2, 0.2}, ValueRange::kUnit, ColorOrder::kBGR}, c10::kCPU, false); },
      {"RGB order", "BGR order", "mean_std_order"});
}

// D4: one value per channel. A single value is not spread over RGB (the default, Fashion-MNIST's
// gray mean, on photos); the error names both keys, the counts, the channels and what to set.
TEST(DeviceInput, OneValueForThreeChannelsIsRefusedD4) {
  const ImageSpec rgb{2, 2, 3, ColorOrder::kRGB, ValueRange::kByte};
  test::expect_bad_input([&] { DeviceInput(rgb, {{0.2860}, {0.3530}, ValueRange::kUnit}, c10::kCPU, false); },
                         {"data.mean has 1 value(s)", "data.std has 1", "3 channel(s)", "set data.mean and data.std to 3",
                          "RGB order", "data.mean = [0.485, 0.456, 0.406]", "data.std = [0.229, 0.224, 0.225]"});
  // In byte units the suggestion is in byte units too.
  test::expect_bad_input([&] { DeviceInput(rgb, {{72.9}, {90.0}, ValueRange::kByte}, c10::kCPU, false); },
                         {"data.mean has 1 value(s)", "3 channel(s)", "data.mean_std_range = \"byte\"",
                          "data.mean = [123.675, 116.28, 103.53]"});
  // Mean and std of different lengths, and 3 values for 1 channel.
  test::expect_bad_input(
      [&] { DeviceInput(rgb, {{0.485, 0.456, 0.406}, {0.25}, ValueRange::kUnit}, c10::kCPU, false); },
      {"data.mean has 3 value(s) and data.std has 1", "3 channel(s)"});
  const ImageSpec gray{2, 2, 1, ColorOrder::kGray, ValueRange::kByte};
  test::expect_bad_input(
      [&] { DeviceInput(gray, {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}, ValueRange::kUnit}, c10::kCPU, false); },
      {"data.mean has 3 value(s)", "1 channel(s)", "to 1 value(s) each"});
  // One value per channel is accepted, gray and RGB.
  DeviceInput(gray, {{0.2860}, {0.3530}, ValueRange::kUnit}, c10::kCPU, false);
  DeviceInput(rgb, {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}, ValueRange::kUnit}, c10::kCPU, false);
}

}  // namespace
}  // namespace crucible::data
