// The JPEG/PNG pipeline: batches identical for 1, 2 and 4 threads and across a mid-epoch
// save/restore (law 1); caches change speed, never pixels (D1); BGR only when asked and
// swapped exactly (D3); crops come out crop × crop; the open-file need is checked (D6).
#include "crucible/data/pipeline.h"

#include <gtest/gtest.h>

#include <cstring>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"
#include "crucible/data/loader.h"
#include "crucible/data/sample_source.h"
#include "test_util.h"

namespace crucible::data {
namespace {

// A small ImageFolder of JPEGs and PNGs of assorted sizes (made by PIL).
void make_folder(const std::string& root, int n) {
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(0)\n"
                   "for i in range(" + std::to_string(n) + "):\n"
                   "    d = os.path.join('" + root + "', 'c%d' % (i % 3)); os.makedirs(d, exist_ok=True)\n"
                   "    w, h = int(rng.integers(40, 160)), int(rng.integers(40, 160))\n"
                   "    y, x = np.mgrid[0:h, 0:w]\n"
                   "    a = np.stack([(x * 3 + i) % 256, (y * 5) % 256, ((x + y) * 7) % 256], -1).astype(np.uint8)\n"
                   "    Image.fromarray(a).save(os.path.join(d, '%03d.%s' % (i, 'png' if i % 4 == 0 else 'jpg')), quality=90)\n");
}

std::string run_digest(const std::shared_ptr<const SamplePipeline>& p, int threads, int64_t split_at = -1) {
  LoaderOptions o;
  o.batch_size = 8;
  o.threads = threads;
  o.prefetch = 3;
  Sampler sampler(p->size(), true, 11);
  auto loader = std::make_unique<Loader>(p, sampler, o);
  Sha256 h;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader->start_epoch(epoch);
    int64_t n = 0;
    for (;;) {
      if (epoch == 1 && n == split_at) {  // save (epoch 1, batch n), rebuild, restore
        loader = std::make_unique<Loader>(p, sampler, o);
        loader->start_epoch(epoch, split_at);
      }
      auto b = loader->next();
      if (!b) break;
      ++n;
      h.update(b->pixels.data(), b->pixels.size());
      h.update(b->labels.data(), b->labels.size() * 8);
    }
  }
  return h.hex_digest();
}

ImagePipelineOptions options(int crop) {
  ImagePipelineOptions o;
  o.crop = crop;
  o.augment_seed = 5;
  return o;
}

TEST(ImagePipeline, SameBatchesForAnyThreadCountAndAcrossRestore) {
  test::TempDir d;
  make_folder(d.path(), 40);
  auto p = std::make_shared<ImagePipeline>(open_image_folder(d.path()), options(32));
  const std::string one = run_digest(p, 1);
  EXPECT_EQ(run_digest(p, 2), one);
  EXPECT_EQ(run_digest(p, 4), one);
  EXPECT_EQ(run_digest(p, 3, /*split_at=*/2), one);
}

// "encoded" keeps the file bytes: pixels equal no cache. "decoded" keeps full-resolution
// pixels, so its crops are resized from full resolution (no DCT scaling): its own digest,
// identical whether a sample came from the cache or was decoded again.
TEST(ImagePipeline, CachesChangeNothingButSpeedD1) {
  test::TempDir d;
  make_folder(d.path(), 24);
  auto src = std::shared_ptr<const SampleSource>(open_image_folder(d.path()));
  const std::string plain = run_digest(std::make_shared<ImagePipeline>(src, options(24)), 2);
  for (CacheMode kind : {CacheMode::kEncoded, CacheMode::kDecoded}) {
    ImagePipelineOptions o = options(24);
    o.cache = kind;
    o.cache_bytes = int64_t{64} << 20;
    auto p = std::make_shared<ImagePipeline>(src, o);
    const std::string cached = run_digest(p, 2);
    if (kind == CacheMode::kEncoded) {
      EXPECT_EQ(cached, plain);
    }
    EXPECT_GT(p->cached_bytes(), 0) << cache_mode_name(kind);
    // A budget smaller than one sample caches nothing and gives the same batches.
    o.cache_bytes = 16;
    auto tiny = std::make_shared<ImagePipeline>(src, o);
    EXPECT_EQ(run_digest(tiny, 2), cached) << cache_mode_name(kind);
    EXPECT_EQ(tiny->cached_bytes(), 0) << cache_mode_name(kind);
    // Second and later epochs come from the cache: still the same.
    EXPECT_EQ(run_digest(p, 3), cached) << cache_mode_name(kind);
  }
}

TEST(ImagePipeline, BgrOnlyWhenAskedAndExactlySwappedD3) {
  test::TempDir d;
  make_folder(d.path(), 6);
  auto src = std::shared_ptr<const SampleSource>(open_image_folder(d.path()));
  ImagePipeline rgb(src, options(16));
  ImagePipelineOptions bo = options(16);
  bo.order = ColorOrder::kBGR;
  ImagePipeline bgr(src, bo);
  EXPECT_EQ(rgb.output_spec().order, ColorOrder::kRGB);
  EXPECT_EQ(bgr.output_spec().order, ColorOrder::kBGR);
  std::vector<uint8_t> a(16 * 16 * 3), b(16 * 16 * 3);
  rgb.produce(3, 0, a.data());
  bgr.produce(3, 0, b.data());
  for (int i = 0; i < 16 * 16; ++i) {
    EXPECT_EQ(a[3 * i], b[3 * i + 2]);
    EXPECT_EQ(a[3 * i + 1], b[3 * i + 1]);
  }
}

TEST(ImagePipeline, EvaluationCropIsDeterministic) {
  test::TempDir d;
  make_folder(d.path(), 6);
  ImagePipelineOptions o = options(20);
  o.train = false;
  ImagePipeline p(open_image_folder(d.path()), o);
  std::vector<uint8_t> a(20 * 20 * 3), b(20 * 20 * 3);
  p.produce(1, 0, a.data());
  p.produce(1, 7, b.data());  // no randomness: every epoch sees the same centre crop
  EXPECT_EQ(a, b);
}

class ThirstyPipeline : public SamplePipeline {
 public:
  int64_t size() const override { return 10; }
  ImageSpec output_spec() const override { return ImageSpec{1, 1, 1, ColorOrder::kGray, ValueRange::kByte}; }
  int64_t produce(int64_t, int64_t, uint8_t*) const override { return 0; }
  std::string describe() const override { return "thirsty"; }
  int files_needed(int threads) const override { return 1000000 * threads; }
};

TEST(Loader, OpenFileNeedIsCheckedAgainstUlimitD6) {
  LoaderOptions o;
  o.threads = 2;
  test::expect_bad_input([&] { Loader(std::make_shared<ThirstyPipeline>(), Sampler(10, false, 0), o); },
                         {"ulimit -n", "open files"});
}

}  // namespace
}  // namespace crucible::data
