// CUDA-labelled tests (ctest -L cuda; scripts/device-check runs them on the GPU machine):
// names end in _CUDA and skip where libtorch sees no GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <c10/core/StreamGuard.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

#include "crucible/core/compat.h"
#include "crucible/data/loader/device_feeder.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/trainer.h"
#include "test_util.h"

namespace crucible::train {
namespace {

bool have_cuda() { return compat::cuda_device_count() > 0; }

// The default job on the first GPU, on a subset, quietly.
JobConfig gpu_job(const std::string& dir, int64_t train_samples, int64_t epochs) {
  JobConfig j;
  j.run.dir = dir;
  j.train.device = "cuda";
  j.data.train_samples = train_samples;
  j.train.epochs = epochs;
  j.log.progress = "none";
  return j;
}

// The default job on the GPU for a few steps, in bf16 and in fp16 (with the loss scaler),
// data through pinned memory (D9): it runs, stays finite and learns.
TEST(Trainer, ShortRunsOnTheGpu_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible to libtorch " << compat::torch_version();
  for (PrecisionMode precision : {PrecisionMode::kBf16, PrecisionMode::kFp16}) {
    test::TempDir d;
    JobConfig j = gpu_job(d.path(), 8192, 2);
    j.train.precision = precision;
    const TrainSummary s = Trainer(j).run();
    EXPECT_GT(s.test_acc, 0.7) << s.precision.value.to_string();
  }
}

// precision = "auto" on a GPU: the choice is the candidate with the smallest time it measured
// (a whole training step of each), and the steps then ran in it.
TEST(Trainer, AutoPrecisionOnTheGpuPicksTheFastestItTimed_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  test::TempDir d;
  JobConfig j = gpu_job(d.path(), 8192, 1);
  j.train.precision = PrecisionMode::kAuto;
  j.train.max_steps = 2;
  const TrainSummary s = Trainer(j).run();
  const PrecisionChoice& c = s.precision;
  EXPECT_EQ(c.source, "auto");
  ASSERT_GE(c.timed.size(), 2u);
  const PrecisionTiming* fastest = &c.timed[0];
  for (const auto& t : c.timed) {
    EXPECT_GT(t.ms, 0) << t.precision.to_string();
    if (t.ms < fastest->ms) fastest = &t;
  }
  EXPECT_EQ(c.value, fastest->precision);
  EXPECT_EQ(s.step_dtype, c.value.dtype == ComputeDtype::kBf16 ? "BFloat16" : "Float");
}

// T13: memory freed by tensors stays cached by the allocator until release_cached_memory
// gives it back (measured through the allocator's own statistics).
TEST(Compat, AutocastAndCacheReleaseOnTheGpu_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  at::Tensor a = at::randn({64, 64}, at::TensorOptions().device(dev));
  {
    compat::AutocastGuard g(c10::DeviceType::CUDA, c10::ScalarType::Half, true);
    EXPECT_EQ(at::mm(a, a).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(at::mm(a, a).scalar_type(), at::kFloat);
  compat::release_cached_memory(dev);
  const int64_t before = compat::cached_memory_bytes(dev);
  {
    at::Tensor big = at::empty({int64_t{256} << 20}, at::TensorOptions().dtype(at::kByte).device(dev));
    big.fill_(1);
  }  // freed: the allocator keeps the block
  EXPECT_GE(compat::cached_memory_bytes(dev) - before, int64_t{256} << 20);
  compat::release_cached_memory(dev);
  EXPECT_LT(compat::cached_memory_bytes(dev), int64_t{256} << 20);
  EXPECT_LE(compat::cached_memory_bytes(dev), before);
}

// D9: on a GPU the loader's batches live in pinned host memory (so the host-to-device copies
// are asynchronous), and DeviceInput's images and labels land on the device. On CPU the
// allocator is null (the loader's recycled heap buffers).
TEST(DeviceInput, BatchesArePinnedForTheGpuD9_CUDA) {
  EXPECT_FALSE(data::DeviceInput::batch_allocator(c10::Device(c10::DeviceType::CPU)));
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  auto allocate = data::DeviceInput::batch_allocator(dev);
  ASSERT_TRUE(allocate);
  data::PixelBuffer buf = allocate(size_t{4} * 28 * 28);
  const at::Tensor host = at::from_blob(buf.data(), {4 * 28 * 28}, at::kByte);
  EXPECT_TRUE(host.is_pinned()) << "batch memory is pageable: every copy would synchronise";
  EXPECT_FALSE(at::empty({16}, at::kByte).is_pinned());  // the control: plain heap memory is not
}

// D9: both copies of a batch (pixels and labels) leave the host without waiting for the GPU.
// Under torch's sync-debug switch set to "error", any synchronising call raises; the control
// is a plain blocking copy from pageable memory, which does raise.
TEST(DeviceInput, CopiesNeverWaitForTheGpuD9_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  data::Batch b;
  b.spec = data::ImageSpec{28, 28, 1, data::ColorOrder::kGray, data::ValueRange::kByte};
  b.pixels = data::DeviceInput::batch_allocator(dev)(size_t{4} * 28 * 28);
  for (size_t i = 0; i < b.pixels.size(); ++i) b.pixels.data()[i] = static_cast<uint8_t>(i);
  b.labels = {1, 2, 3, 4};
  b.sample_ids = {0, 1, 2, 3};
  data::DeviceInput in(b.spec, {{0.5}, {0.25}, data::ValueRange::kUnit}, dev, false);
  at::Tensor x, y;
  compat::set_sync_debug_mode("error");
  EXPECT_NO_THROW({
    x = in.images(b);
    y = in.labels(b);
  });
  EXPECT_ANY_THROW((void)at::arange(4).to(dev, /*non_blocking=*/false, /*copy=*/true).sum().item<int64_t>())
      << "the control: sync-debug mode did not catch a synchronising call";
  compat::set_sync_debug_mode("off");
  ASSERT_TRUE(y.is_cuda());
  EXPECT_TRUE(at::equal(y.cpu(), at::tensor(std::vector<int64_t>{1, 2, 3, 4})));
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{4, 1, 28, 28}));
}

// T5: TF32 is in effect on the GPU exactly when train.matmul_precision says so, measured, not read
// from a flag: the error of a float32 product against a float64 one. TF32 keeps 10 mantissa bits
// (a relative error near 1e-3); float32 keeps 23 (near 1e-6). "highest" must hold convolutions to
// float32 too (torch leaves cuDNN's TF32 on by default; compat turns it off with the matmuls').
TEST(Compat, Tf32IsUsedExactlyWhenMatmulPrecisionSaysSoT5_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  const auto f64 = at::TensorOptions().device(dev).dtype(at::kDouble);
  const at::Tensor a = at::randn({1024, 1024}, f64), b = at::randn({1024, 1024}, f64);
  const at::Tensor x = at::randn({8, 64, 32, 32}, f64), w = at::randn({64, 64, 3, 3}, f64);
  auto relative = [](const at::Tensor& got, const at::Tensor& want) {
    return ((got.to(at::kDouble) - want).abs().max() / want.abs().max()).item<double>();
  };
  const std::string was = compat::matmul_precision();
  for (const std::string precision : {"highest", "high", "highest"}) {
    compat::set_matmul_precision(precision);
    const double mm = relative(at::mm(a.to(at::kFloat), b.to(at::kFloat)), at::mm(a, b));
    const double conv = relative(at::conv2d(x.to(at::kFloat), w.to(at::kFloat)), at::conv2d(x, w));
    std::printf("matmul_precision %s: matmul error %.2e, convolution error %.2e, tf32 {matmul %d, conv %d}\n",
                precision.c_str(), mm, conv, compat::tf32_in_effect().matmul, compat::tf32_in_effect().conv);
    if (precision == "highest") {
      EXPECT_LT(mm, 1e-5) << "TF32 (or worse) in a float32 matmul at matmul_precision = highest";
      // 5e-5, not 1e-5: cuDNN may pick a Winograd algorithm, a little less exact than a plain sum,
      // but TF32 here errs near 5e-4 (K = 576 products of 10-bit mantissas).
      EXPECT_LT(conv, 5e-5) << "TF32 in a float32 convolution at matmul_precision = highest";
      EXPECT_FALSE(compat::tf32_in_effect().matmul || compat::tf32_in_effect().conv);
    } else {
      EXPECT_GT(mm, 1e-4) << "matmul_precision = high but the matmul ran in full float32: TF32 not in effect";
      EXPECT_TRUE(compat::tf32_in_effect().matmul && compat::tf32_in_effect().conv);
      // cuDNN may still pick a float32 algorithm for a convolution where TF32 is allowed: said, not failed.
      if (conv < 1e-5) std::printf("note: cuDNN chose a full-float32 convolution with TF32 allowed\n");
    }
  }
  compat::set_matmul_precision(was);
}

// T13 on the GPU: with train.release_cache each epoch end gives the CUDA caching allocator's
// unused blocks back (what the evaluation's larger batches left cached), and the memory held
// after it is below the same run's without the release; the weights do not change (deterministic
// kernels, so that two GPU runs can be compared bit for bit). Through the program, as a user runs it.
TEST(Trainer, EpochEndsGiveTheGpuCacheBackT13_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  test::TempDir d;
  auto run = [&](const std::string& name, const std::string& release) {
    const auto r = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set",
                                      "run.name=" + name, "--set", "train.device=cuda", "--set",
                                      "data.train_samples=2048", "--set", "data.test_samples=2000", "--set",
                                      "train.epochs=2", "--set", "train.batch_size=128", "--set",
                                      "train.eval_batch_size=1000", "--set", "train.release_cache=" + release, "--set",
                                      "train.deterministic=true", "--set", "log.progress=none"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return nlohmann::json::parse(test::read_text(d.path() + "/" + name + "/summary.json"));
  };
  test::expect_epoch_ends_released(run("release", "true"), run("keep", "false"), int64_t{8} << 20);
}

// The GPU's generator (dropout on the GPU) round-trips through its state, which checkpoints of
// GPU runs keep as rng.torch_cuda; a resumed run continues the same dropout stream.
TEST(Compat, GpuGeneratorStateRoundTrips_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  compat::seed_device_generator(dev, 3);
  const at::Tensor s = compat::generator_state(dev);
  const at::Tensor ones = at::ones({4096}, at::TensorOptions().device(dev));
  const at::Tensor a = at::dropout(ones, 0.5, true);
  compat::set_generator_state(dev, s);
  const at::Tensor b = at::dropout(ones, 0.5, true);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(b, at::dropout(ones, 0.5, true)));
}

TEST(Trainer, GpuCheckpointKeepsTheDropoutGenerator_CUDA) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  test::TempDir d;
  JobConfig j = gpu_job(d.path(), 2048, 1);
  j.train.deterministic = true;
  Trainer(j).run();
  CheckpointManager m(d.path() + "/" + j.run.name + "/checkpoints", 3);
  std::string path;
  const auto ckpt = m.load_latest(&path);
  ASSERT_TRUE(ckpt.has_value());
  const at::Tensor* rng = ckpt->find("rng.torch_cuda");
  ASSERT_NE(rng, nullptr) << path << " has no GPU generator state";
  EXPECT_TRUE(at::equal(*rng, compat::generator_state(c10::Device(c10::DeviceType::CUDA, 0))))
      << "the saved state is not the generator's state at the end of the run";
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);  // M6: set before the first product
}

}  // namespace
}  // namespace crucible::train

namespace crucible::data {
namespace {

// Device work that takes a while, on the current stream (float32 products of 2048², ~0.3 ms each on
// an H100), for the tests below to hold a stream busy without the host waiting.
void keep_busy(c10::Device dev, int products) {
  const at::Tensor w = at::full({2048, 2048}, 1.0 / 2048, at::TensorOptions().device(dev));
  at::Tensor acc = w;
  for (int i = 0; i < products; ++i) acc = at::mm(acc, w);
}

// `n` batches of `images` RGB images of `side`² pixels in pinned memory (the trainer's
// allocator), batch k filled with the byte value_of(k), labels k.
struct PinnedBatches {
  c10::Device dev;
  int64_t n, images, side;
  int64_t made = 0;
  static uint8_t value_of(int64_t k) { return static_cast<uint8_t>((k * 37 + 11) % 256); }
  ImageSpec spec() const { return ImageSpec{side, side, 3, ColorOrder::kRGB, ValueRange::kByte}; }
  std::optional<Batch> operator()() {
    if (made == n) return std::nullopt;
    Batch b;
    b.spec = spec();
    b.pixels = DeviceInput::batch_allocator(dev)(static_cast<size_t>(images * side * side * 3));
    std::memset(b.pixels.data(), value_of(made), b.pixels.size());
    b.labels.assign(static_cast<size_t>(images), made);
    for (int64_t i = 0; i < images; ++i) b.sample_ids.push_back(made * images + i);
    ++made;
    return b;
  }
};

// D9: each batch's copy and conversion run on the copy stream while the steps before it compute
// (read from device-timeline marks: no host clock, no synchronisation), and the loop of take,
// hand over and compute never synchronises with the host (sync-debug mode "error" raises on any
// synchronising call; T6).
TEST(DeviceFeeder, CopiesRunBesideTheStepOnASideStreamD9_CUDA) {
  if (!train::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  // 14 MB a batch against ~14 ms of products a step: the host (memset, pinned allocation) keeps
  // ahead of the device, so every copy after the first few is queued while steps are still queued.
  PinnedBatches loader{dev, 12, 32, 384};
  const DeviceInput in(loader.spec(), {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}, ValueRange::kUnit}, dev, true);
  const int64_t ahead = 2;
  DeviceFeeder f(in, dev, {ahead, /*time_copies=*/true});
  ASSERT_TRUE(f.on_side_stream()) << f.describe();
  const auto origin = compat::record_timeline_mark(dev);
  std::vector<FedBatch> fed;
  std::vector<std::shared_ptr<compat::TimelineMark>> begin, end;
  compat::set_sync_debug_mode("error");
  EXPECT_NO_THROW({
    while (std::optional<FedBatch> b = f.take([&loader] { return loader(); })) {
      f.hand_over(*b);
      begin.push_back(compat::record_timeline_mark(dev));
      keep_busy(dev, 40);
      (void)b->images.sum();
      end.push_back(compat::record_timeline_mark(dev));
      fed.push_back(std::move(*b));
    }
  });
  compat::set_sync_debug_mode("off");
  ASSERT_EQ(fed.size(), 12u);
  auto at = [&origin](compat::TimelineMark& m) { return compat::timeline_seconds(*origin, m); };
  // Batches ahead + 1 on were queued while earlier steps computed: their copies should lie
  // within the steps' time, not between them.
  double copying = 0, beside = 0;
  for (size_t k = static_cast<size_t>(ahead) + 1; k < fed.size(); ++k) {
    ASSERT_TRUE(fed[k].copy_begin && fed[k].copy_end);
    const double c0 = at(*fed[k].copy_begin), c1 = at(*fed[k].copy_end);
    copying += c1 - c0;
    for (size_t s = 0; s < begin.size(); ++s) {
      beside += std::max(0.0, std::min(c1, at(*end[s])) - std::max(c0, at(*begin[s])));
    }
    // Handed over only after its copy: step k began after batch k's copy ended.
    EXPECT_GE(at(*begin[k]), c1) << "step " << k << " began before its batch was on the device";
  }
  EXPECT_GT(copying, 0);
  EXPECT_GE(beside, 0.8 * copying) << "copies " << copying * 1e3 << " ms, of which beside a step " << beside * 1e3
                                   << " ms: copy and compute took turns";
}

// D9: no batch changes while it is copied or read. The copy stream is held busy so that every
// copy is still queued when the host lets go of its pinned buffer and the next pull writes a
// new batch (torch's host allocator must not hand the buffer out again); each step then reads
// its batch after a delay on the compute stream, while the next copies land (the device
// allocator must not give its blocks to them). Every batch must read back as what was written.
TEST(DeviceFeeder, ABatchNeverChangesWhileItIsCopiedOrReadD9_CUDA) {
  if (!train::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  PinnedBatches loader{dev, 12, 32, 256};
  const DeviceInput in(loader.spec(), {{0, 0, 0}, {1, 1, 1}, ValueRange::kUnit}, dev, false);  // x/255
  DeviceFeeder f(in, dev, {3, false});
  {
    c10::StreamGuard on_copy(f.copy_stream());
    keep_busy(dev, 40);
  }
  std::vector<at::Tensor> seen;  // [min, max] of each batch as the step read it, on the device
  while (std::optional<FedBatch> b = f.take([&loader] { return loader(); })) {
    f.hand_over(*b);
    keep_busy(dev, 20);  // the compute stream lags the host: later copies land while this read waits
    seen.push_back(at::stack({b->images.min(), b->images.max(), b->labels.to(at::kFloat).mean()}));
  }  // each FedBatch dies here, before the next take queues more copies
  ASSERT_EQ(seen.size(), 12u);
  for (size_t k = 0; k < seen.size(); ++k) {
    const at::Tensor s = seen[k].cpu();
    const float want = static_cast<float>(PinnedBatches::value_of(static_cast<int64_t>(k))) / 255.0f;
    EXPECT_NEAR(s[0].item<float>(), want, 1e-6) << "batch " << k << " changed while it was copied or read";
    EXPECT_NEAR(s[1].item<float>(), want, 1e-6) << "batch " << k;
    EXPECT_EQ(s[2].item<float>(), static_cast<float>(k)) << "batch " << k << "'s labels";
  }
}

}  // namespace
}  // namespace crucible::data
