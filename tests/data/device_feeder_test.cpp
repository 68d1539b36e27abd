// D9: the device feeder hands out the loader's batches in the loader's order, pulls `ahead`
// batches beyond the one handed out (fewer at an epoch's end), and converts them exactly as
// DeviceInput does. The side stream itself runs on a GPU only (cuda_test.cpp); here the queue.
#include "crucible/data/loader/device_feeder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "crucible/core/error.h"

namespace crucible::data {
namespace {

const ImageSpec kSpec{4, 4, 3, ColorOrder::kRGB, ValueRange::kByte};
const NormalizeOptions kNorm{{0.5, 0.4, 0.3}, {0.2, 0.25, 0.5}, ValueRange::kUnit, ColorOrder::kRGB};

// Batch k of 2 images: pixels k*7 + i (mod 256), labels k and k+1, ids 2k and 2k+1.
Batch batch_number(int64_t k) {
  Batch b;
  b.spec = kSpec;
  b.pixels = PixelBuffer::heap(size_t{2} * 4 * 4 * 3);
  for (size_t i = 0; i < b.pixels.size(); ++i) b.pixels.data()[i] = static_cast<uint8_t>(k * 7 + static_cast<int64_t>(i));
  b.labels = {k, k + 1};
  b.sample_ids = {2 * k, 2 * k + 1};
  b.epoch = 0;
  return b;
}

// A loader of `n` batches that counts the times it was asked.
struct CountingLoader {
  int64_t n = 0, given = 0, asked = 0;
  std::optional<Batch> operator()() {
    ++asked;
    if (given == n) return std::nullopt;
    return batch_number(given++);
  }
};

TEST(DeviceFeeder, PullsAheadAndHandsOutTheLoadersOrderConvertedAsDeviceInputDoesD9) {
  const DeviceInput in(kSpec, kNorm, c10::kCPU, /*channels_last=*/true);
  for (int64_t ahead : {0, 1, 3}) {
    DeviceFeeder f(in, c10::kCPU, {ahead, false});
    CountingLoader loader{7};
    auto pull = [&loader] { return loader(); };
    for (int64_t k = 0; k < 7; ++k) {
      std::optional<FedBatch> b = f.take(pull);
      ASSERT_TRUE(b.has_value()) << "ahead " << ahead << " batch " << k;
      // Taken: this batch and `ahead` more (the loader has 7).
      EXPECT_EQ(loader.given, std::min<int64_t>(k + 1 + ahead, 7)) << "ahead " << ahead << " batch " << k;
      EXPECT_EQ(static_cast<int64_t>(f.queued()), std::min<int64_t>(ahead, 6 - k));
      EXPECT_EQ(b->host.sample_ids, (std::vector<int64_t>{2 * k, 2 * k + 1}));
      EXPECT_FALSE(b->images.defined()) << "converted before it was handed over (the transfer phase)";
      f.hand_over(*b);
      f.hand_over(*b);  // idempotent
      const Batch ref = batch_number(k);
      EXPECT_TRUE(at::equal(b->images, in.images(ref))) << "ahead " << ahead << " batch " << k;
      EXPECT_TRUE(b->images.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_TRUE(at::equal(b->labels, in.labels(ref)));
    }
    EXPECT_FALSE(f.take(pull).has_value());
    const int64_t asked = loader.asked;
    EXPECT_FALSE(f.take(pull).has_value());
    EXPECT_EQ(loader.asked, asked) << "the loader was asked again after it said the epoch ended";
    // A new epoch (or a restart inside one) asks again.
    f.reset();
    loader.given = 0;
    std::optional<FedBatch> again = f.take(pull);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->host.sample_ids, (std::vector<int64_t>{0, 1}));
  }
}

TEST(DeviceFeeder, ResetDropsWhatWasQueuedD9) {
  const DeviceInput in(kSpec, kNorm, c10::kCPU, false);
  DeviceFeeder f(in, c10::kCPU, {2, false});
  CountingLoader loader{10};
  auto pull = [&loader] { return loader(); };
  ASSERT_TRUE(f.take(pull).has_value());
  EXPECT_EQ(f.queued(), 2u);
  f.reset();  // e.g. the run stopped inside an epoch and resumes at batch 1 of a restarted loader
  EXPECT_EQ(f.queued(), 0u);
  loader.given = 1;
  std::optional<FedBatch> b = f.take(pull);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->host.labels, (std::vector<int64_t>{1, 2}));
}

TEST(DeviceFeeder, SaysWhatItDoesAndRefusesANegativeDepth) {
  const DeviceInput in(kSpec, kNorm, c10::kCPU, false);
  EXPECT_EQ(DeviceFeeder(in, c10::kCPU, {0, false}).describe(), "converted when taken");
  EXPECT_FALSE(DeviceFeeder(in, c10::kCPU, {4, false}).on_side_stream()) << "a side stream on the CPU";
  EXPECT_THROW(DeviceFeeder(in, c10::kCPU, {-1, false}), Error);
}

}  // namespace
}  // namespace crucible::data
