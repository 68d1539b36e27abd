// data.dataset = "arrays" through the Loader and DeviceInput: float features reach the model
// bit for bit as [batch, channels, height, width] float32 (no normalisation, no flip), for any
// loader thread count and memory format; uint8 arrays go the images' way; the model's law-3
// check sees the features' channels.
// To add a case: write arrays with NumPy (test::run_python), open them with
// load_array_source, and compare DeviceInput's tensor with the file's bytes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/data/formats/array_source.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/samplers/sampler.h"
#include "crucible/nn/model.h"
#include "test_util.h"

namespace crucible::data {
namespace {

// The first `n` samples of an .npy float32 file [n, ...] as a tensor (NumPy wrote it; the
// header is read by the oracle, not by crucible).
at::Tensor numpy_floats(const std::string& path, std::vector<int64_t> shape) {
  const std::string hex = test::run_python("import numpy as np\nprint(np.load('" + path + "').tobytes().hex())\n");
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return at::from_blob(bytes.data(), shape, at::kFloat).clone();
}

TEST(ArrayInput, FloatFeaturesReachTheDeviceBitEqualAsNCHW) {
  test::TempDir d;
  // Values no normalisation or flip would leave alone: random, negative, tiny, huge.
  test::run_python("import numpy as np\n"
                   "rng = np.random.default_rng(5)\n"
                   "x = (rng.standard_normal((10, 3, 4, 5)) * 10.0 ** rng.integers(-30, 30, (10, 3, 4, 5)))"
                   ".astype(np.float32)\n"
                   "np.save('" + (d / "x.npy") + "', x)\n"
                   "np.save('" + (d / "y.npy") + "', np.arange(10) % 3)\n");
  const at::Tensor want = numpy_floats(d / "x.npy", {10, 3, 4, 5});
  std::shared_ptr<const ArraySource> src = load_array_source(d / "x.npy", d / "y.npy");
  ASSERT_EQ(src->spec().type, SampleType::kFeatures);
  auto pipe = std::make_shared<ArrayPipeline>(src, test::flip(0.0f), 0);
  // data.mean/std with 1 value for 3 channels in the wrong units: not used, not checked.
  const NormalizeOptions norm{{72.0}, {90.0}, ValueRange::kUnit, ColorOrder::kRGB};
  for (int threads : {1, 3}) {
    for (bool channels_last : {false, true}) {
      LoaderOptions o;
      o.batch_size = 4;
      o.threads = threads;
      Loader loader(pipe, DistributedSampler(10, /*shuffle=*/true, 11), o);
      DeviceInput in(src->spec(), norm, c10::kCPU, channels_last);
      loader.start_epoch(2);
      int64_t seen = 0;
      while (auto b = loader.next()) {
        const at::Tensor x = in.images(*b);
        EXPECT_EQ(x.scalar_type(), at::kFloat);
        EXPECT_EQ(x.sizes(), (at::IntArrayRef{b->size(), 3, 4, 5}));
        EXPECT_EQ(x.is_contiguous(at::MemoryFormat::ChannelsLast), channels_last);
        const at::Tensor ids = at::tensor(b->sample_ids);
        EXPECT_TRUE(at::equal(x, want.index_select(0, ids))) << "threads " << threads << " batch " << b->index;
        // The tensor owns its values: the batch buffer may be recycled after this.
        std::memset(b->pixels.data(), 0xFF, b->pixels.size());
        EXPECT_TRUE(at::equal(x, want.index_select(0, ids)));
        seen += b->size();
      }
      EXPECT_EQ(seen, 10);
    }
  }
  // What the model is told (law 3): 3 channels, as they are.
  DeviceInput in(src->spec(), norm, c10::kCPU, false);
  const InputConvention c = in.delivers();
  EXPECT_EQ(c.channels, 3);
  EXPECT_TRUE(c.as_given);
  EXPECT_TRUE(c.mean.empty());
  test::expect_contains(c.describe(), "used as they are");
  test::expect_contains(in.describe(), "not applied");
}

TEST(ArrayInput, SampleBatchCarriesFloatFeatures) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.save('" + (d / "x.npy") + "', np.arange(3 * 8, dtype=np.float64).reshape(3, 8) - 4.5)\n"
                   "np.save('" + (d / "y.npy") + "', np.array([0, 1, 0], np.uint8))\n");
  std::shared_ptr<const ArraySource> src = load_array_source(d / "x.npy", d / "y.npy");
  ArrayPipeline pipe(src, SampleTransforms{}, 0);
  const Batch b = sample_batch(pipe, 5);  // cycles: 0 1 2 0 1
  DeviceInput in(src->spec(), {{0.5}, {0.5}, ValueRange::kUnit}, c10::kCPU, true);
  const at::Tensor x = in.images(b);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{5, 8, 1, 1}));
  const at::Tensor want = (at::arange(24, at::kDouble).view({3, 8, 1, 1}) - 4.5).to(at::kFloat);
  EXPECT_TRUE(at::equal(x, want.index_select(0, at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1}))));
}

TEST(ArrayInput, ThreeChannelFeaturesForAOneChannelModelAreRefused) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.save('" + (d / "x.npy") + "', np.zeros((2, 3, 4, 4), np.float32))\n"
                   "np.save('" + (d / "y.npy") + "', np.zeros(2, np.int64))\n");
  auto src = load_array_source(d / "x.npy", d / "y.npy");
  DeviceInput in(src->spec(), {{0.5}, {0.5}, ValueRange::kUnit}, c10::kCPU, false);
  nn::InputSpec model;
  model.channels = 1;
  test::expect_bad_input([&] { nn::check_input(model, in.delivers(), "the model in ckpt.safetensors"); },
                         {"takes 1 channel(s)", "delivers 3", "used as they are"});
  // A model trained on normalised uint8 images does not take float features either.
  model.channels = 3;
  model.order = ColorOrder::kRGB;
  model.mean = {0.5, 0.5, 0.5};
  model.std = {0.2, 0.2, 0.2};
  test::expect_bad_input([&] { nn::check_input(model, in.delivers(), "the model in ckpt.safetensors"); },
                         {"the model in ckpt.safetensors"});
}

TEST(ArrayInput, Uint8ArraysAreNormalisedLikeImages) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "x = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3) * 10\n"
                   "np.save('" + (d / "x.npy") + "', x)\n"
                   "np.save('" + (d / "y.npy") + "', np.array([1, 0]))\n");
  std::shared_ptr<const ArraySource> src = load_array_source(d / "x.npy", d / "y.npy");
  const Batch b = sample_batch(ArrayPipeline(src, test::flip(0.0f), 0), 2);
  DeviceInput in(src->spec(), {{0.5, 0.5, 0.5}, {0.25, 0.25, 0.25}, ValueRange::kUnit}, c10::kCPU, false);
  const at::Tensor want =
      ((at::arange(24, at::kFloat).view({2, 2, 2, 3}).permute({0, 3, 1, 2}) * 10 / 255.0) - 0.5) / 0.25;
  EXPECT_TRUE(at::allclose(in.images(b), want, 1e-5, 1e-5));
  EXPECT_FALSE(in.delivers().as_given);
  // D4: uint8 arrays are images: one value for their 3 channels is refused, as for images.
  test::expect_bad_input([&] { DeviceInput(src->spec(), {{0.5}, {0.25}, ValueRange::kUnit}, c10::kCPU, false); },
                         {"data.mean has 1 value(s)", "3 channel(s)"});
}

}  // namespace
}  // namespace crucible::data
