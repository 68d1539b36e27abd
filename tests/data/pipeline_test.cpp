// The JPEG/PNG pipeline: batches identical for 1, 2 and 4 threads and across a mid-epoch
// save/restore (law 1); caches change speed, never pixels (D1); BGR only when asked and
// swapped exactly (D3); crops come out crop × crop; the open-file need is checked (D6).
#include "crucible/data/loader/pipeline.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <sstream>

#include "crucible/core/error.h"
#include "crucible/core/sha256.h"
#include "crucible/data/transforms/augment.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/transforms/sample_transform.h"
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
  DistributedSampler sampler(p->size(), true, 11);
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
  o.transforms = test::flip(0.5f);
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

// Issue 26: with every automatic augmentation on (after the flip, as torchvision's preset), the
// batches are still identical for 1, 2 and 4 threads and across a mid-epoch restore (law 1, PITFALLS T15: each
// op, bin, sign and mixing weight comes from the sample's own stream) — and the augmentation did
// change them.
TEST(ImagePipeline, EveryAugmentationGivesTheSameBatchesForAnyThreadCountAndAcrossRestore) {
  test::TempDir d;
  make_folder(d.path(), 24);
  auto src = std::shared_ptr<const SampleSource>(open_image_folder(d.path()));
  const std::string plain = run_digest(std::make_shared<ImagePipeline>(src, options(32)), 1);
  for (const char* name : {"trivialaugment_wide", "randaugment", "autoaugment", "augmix"}) {
    for (const char* interpolation : {"nearest", "bilinear"}) {
      AugmentOptions a;
      a.name = name;
      a.interpolation = interpolation;
      ImagePipelineOptions o = options(32);
      o.transforms.push_back(make_augment(a));
      auto p = std::make_shared<ImagePipeline>(src, o);
      const std::string one = run_digest(p, 1);
      EXPECT_NE(one, plain) << name;
      EXPECT_EQ(run_digest(p, 2), one) << name << " " << interpolation;
      EXPECT_EQ(run_digest(p, 4), one) << name << " " << interpolation;
      EXPECT_EQ(run_digest(p, 3, /*split_at=*/2), one) << name << " " << interpolation;
    }
  }
}

// "encoded" keeps the file bytes: pixels equal no cache. "decoded" keeps full-resolution
// pixels, so its crops are resized from full resolution (no DCT scaling): its own digest,
// identical whether a sample came from the cache or was decoded again.
// The flip as a sample transform (issue 25's seam): folded into the resize that writes the crop
// (RandomHorizontalFlip::fold_mirror), it writes the same bytes as the same transform applied
// after the resize, in both layouts, drawing the same values from the sample's stream (law 1).
class UnfoldedFlip final : public SampleTransform {
 public:
  explicit UnfoldedFlip(float p) : flip_(p) {}
  void apply(ImageRef image, SampleRng& rng) const override { flip_.apply(image, rng); }
  std::string describe() const override { return "unfolded " + flip_.describe(); }

 private:
  RandomHorizontalFlip flip_;
};

TEST(ImagePipeline, AFoldedFlipWritesTheBytesOfTheFlipAppliedAfterTheResize) {
  test::TempDir d;
  make_folder(d.path(), 12);
  ImagePipelineOptions folded = options(24), applied = options(24), none = options(24);
  applied.transforms = {std::make_shared<UnfoldedFlip>(0.5f)};
  none.transforms.clear();
  const std::shared_ptr<const SampleSource> source = open_image_folder(d.path());
  const ImagePipeline a(source, folded), b(source, applied), c(source, none);
  const size_t bytes = 24 * 24 * 3;
  int flipped = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t i = 0; i < a.size(); ++i) {
      std::vector<uint8_t> x(bytes), y(bytes), z(bytes);
      a.produce(i, epoch, x.data());
      b.produce(i, epoch, y.data());
      c.produce(i, epoch, z.data());
      EXPECT_EQ(x, y) << "sample " << i << " epoch " << epoch;
      flipped += x != z;
      a.produce_channels_first(i, epoch, x.data());
      b.produce_channels_first(i, epoch, y.data());
      EXPECT_EQ(x, y) << "planes of sample " << i << " epoch " << epoch;
    }
  }
  EXPECT_GT(flipped, 6);  // about half of 36 are mirrored
  EXPECT_LT(flipped, 30);
  EXPECT_NE(a.describe().find("flip p=0.5"), std::string::npos) << a.describe();
}

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

// D2: the pipeline asks libjpeg for the smallest DCT scale M/8 that still covers the size it
// resizes to. 512×384 JPEGs at crop 32: evaluation resizes the short side to int(32 / 0.875) =
// 36, i.e. to 48×36, which scale 1/8 covers: 64×48 pixels decoded per image, not 196,608.
// Training decodes the random region at the smallest M/8 keeping both sides ≥ 32 px: its
// shorter side then lands below 2 × 32 + 1 (M = 1 holds a 512 px side to 64; for M ≥ 2 the
// side at (M − 1)/8 was < 32), its longer side within the aspect ratio's 4/3 of that — so at
// most 65² × 4/3 pixels per sample, while the regions (≥ 8% of the image) hold ≥ 15,728 pixels
// at full scale.
TEST(ImagePipeline, DecodesAtTheSmallestSufficientDctScaleD2) {
  test::TempDir d;
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "os.makedirs('" + d.path() + "/c', exist_ok=True)\n"
                   "y, x = np.mgrid[0:384, 0:512]\n"
                   "for i in range(6):\n"
                   "    a = np.stack([(x + i * 9) % 256, (y * 2) % 256, (x + y) % 256], -1).astype(np.uint8)\n"
                   "    Image.fromarray(a).save('" + d.path() + "/c/%d.jpg' % i, quality=90)\n");
  ImagePipelineOptions o = options(32);
  o.train = false;
  ImagePipeline eval(open_image_folder(d.path()), o);
  std::vector<uint8_t> out(32 * 32 * 3);
  for (int64_t i = 0; i < eval.size(); ++i) eval.produce(i, 0, out.data());
  EXPECT_EQ(eval.decoded_pixels(), 6 * 64 * 48);
  o.train = true;
  ImagePipeline train(open_image_folder(d.path()), o);
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    for (int64_t i = 0; i < train.size(); ++i) {
      const int64_t before = train.decoded_pixels();
      train.produce(i, epoch, out.data());
      const int64_t pixels = train.decoded_pixels() - before;
      EXPECT_GE(pixels, 32 * 32) << "epoch " << epoch << " image " << i;
      EXPECT_LE(pixels, 65 * 65 * 4 / 3) << "epoch " << epoch << " image " << i;
    }
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

// The evaluation transform is torchvision's Resize(int(crop / 0.875)) + CenterCrop(crop) (the
// ImageNet recipe: Resize(256) + CenterCrop(224)), or Resize(data.eval_resize) + CenterCrop
// (FixRes: Resize(232) + CenterCrop(224)), compared with torchvision 0.14 + PIL on
// generated images of assorted sizes, both orientations, down- and upscaled. PNGs (lossless)
// carry sharp stripes about 1/12 of the image wide: only the resize's fixed-point rounding may
// differ (max 1 level). JPEGs carry smooth waves (a JPEG of sharp coloured stripes is mostly
// compression noise): decoded accurately at 224 they match to mean |diff| < 0.5 levels; where
// crucible's decoder takes its shortcuts (1/8 DCT scale for crop 32 (D2), "fast" IDCT and
// chroma upsampling) the pixels differ by a few levels. Either way the crop window must be
// torchvision's: its crop fits better than the same crop moved by 1 or 2 pixels any way.
TEST(ImagePipeline, EvaluationIsTorchvisionResizeThenCentreCrop) {
  test::TempDir d;
  const std::vector<std::pair<int, int>> sizes = {{500, 375}, {375, 500}, {333, 251}, {160, 213}, {97, 130}, {64, 64}};
  std::string py = "import numpy as np, os\nfrom PIL import Image\nsizes = [";
  for (const auto& [w, h] : sizes) py += "(" + std::to_string(w) + ", " + std::to_string(h) + "), ";
  py += "]\n"
        "for fmt in ('png', 'jpg'):\n"
        "    os.makedirs(os.path.join('" + d.path() + "', fmt, 'c'), exist_ok=True)\n"
        "    for i, (w, h) in enumerate(sizes):\n"
        "        y, x = np.mgrid[0:h, 0:w]\n"
        "        a = np.zeros((h, w, 3), np.uint8)\n"
        "        if fmt == 'png':\n"
        "            a[..., 0] = np.where((x // max(2, w // 24)) % 2 == 0, 230, 30)\n"
        "            a[..., 1] = np.where((y // max(2, h // 24)) % 2 == 0, 220, 40)\n"
        "        else:\n"
        "            a[..., 0] = np.round(128 + 100 * np.sin(2 * np.pi * x / (w / 6)))\n"
        "            a[..., 1] = np.round(128 + 100 * np.sin(2 * np.pi * y / (h / 6)))\n"
        "        a[..., 2] = (x * 255 // w + y * 255 // h) // 2\n"
        "        a[:3], a[-3:], a[:, :3], a[:, -3:] = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)\n"
        "        Image.fromarray(a).save(os.path.join('" + d.path() + "', fmt, 'c', '%02d.%s' % (i, fmt)), quality=95)\n";
  test::run_python(py);
  struct Case {
    std::string format;
    int crop;
    std::string decode;  // "fast" | "accurate" | "cached" (data.cache = "decoded": from full resolution)
    int resize = 0;      // FixRes (data.eval_resize): Resize(resize) instead of Resize(int(crop / 0.875))
  };
  const std::vector<Case> cases = {{"png", 224, "fast"},     {"png", 32, "fast"},     {"png", 100, "fast"},
                                   {"png", 224, "cached"},   {"png", 32, "cached"},   {"jpg", 224, "accurate"},
                                   {"jpg", 32, "accurate"},  {"jpg", 224, "fast"},    {"jpg", 32, "fast"},
                                   {"png", 224, "fast", 232}, {"png", 100, "fast", 150}, {"png", 64, "cached", 64}};
  std::string cases_py = "cases = [";
  for (const Case& c : cases) {
    ImagePipelineOptions o = options(c.crop);
    o.train = false;
    o.fast_decode = c.decode != "accurate";
    o.resize = c.resize;
    if (c.decode == "cached") {
      o.cache = CacheMode::kDecoded;
      o.cache_bytes = int64_t{1} << 30;
    }
    ImagePipeline p(open_image_folder(d / c.format), o);
    ASSERT_EQ(p.size(), static_cast<int64_t>(sizes.size()));
    std::vector<uint8_t> px(static_cast<size_t>(c.crop) * c.crop * 3);
    for (int64_t i = 0; i < p.size(); ++i) {
      for (int pass = 0; pass < (c.decode == "cached" ? 2 : 1); ++pass) p.produce(i, 0, px.data());  // miss, hit
      const std::string out =
          d / (c.format + "_" + std::to_string(c.crop) + "_" + std::to_string(c.resize) + "_" + c.decode + "_" +
               std::to_string(i) + ".raw");
      test::write_text(out, std::string(px.begin(), px.end()));
      cases_py += "('" + c.format + "', " + std::to_string(c.crop) + ", '" + c.decode + "', " + std::to_string(i) +
                  ", '" + out + "', " + std::to_string(c.resize) + "), ";
    }
  }
  cases_py += "]\n";
  ImagePipelineOptions small = options(224);
  small.train = false;
  small.resize = 200;  // a short side below the crop is refused, naming both
  test::expect_bad_input([&] { ImagePipeline(open_image_folder(d / "png"), small); },
                         {"data.eval_resize = 200", "evaluation crop 224"});
  const std::string out = test::run_python(
      "import numpy as np, os\nfrom PIL import Image\nimport torchvision.transforms as T\n" + cases_py +
      "for fmt, crop, decode, i, raw, resize in cases:\n"
      "    size = resize or int(crop / 0.875)\n"
      "    img = Image.open(os.path.join('" + d.path() + "', fmt, 'c', '%02d.%s' % (i, fmt))).convert('RGB')\n"
      "    want = np.asarray(T.Compose([T.Resize(size), T.CenterCrop(crop)])(img), np.int16)\n"
      "    got = np.fromfile(raw, np.uint8).reshape(crop, crop, 3).astype(np.int16)\n"
      "    r = np.asarray(T.Resize(size)(img), np.int16)\n"
      "    rh, rw = r.shape[:2]\n"
      "    top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))\n"
      "    assert (r[top:top + crop, left:left + crop] == want).all()\n"
      "    shifted = [np.abs(r[top + dy:top + dy + crop, left + dx:left + dx + crop] - got).mean()\n"
      "               for dy in range(-2, 3) for dx in range(-2, 3) if (dx, dy) != (0, 0)\n"
      "               and 0 <= top + dy and top + dy + crop <= rh and 0 <= left + dx and left + dx + crop <= rw]\n"
      "    diff = np.abs(want - got)\n"
      "    print(fmt, crop, decode, img.size[0], img.size[1], '%.4f' % diff.mean(), int(diff.max()),\n"
      "          '%.4f' % (min(shifted) if shifted else 999.0))\n");
  std::istringstream lines(out);
  std::string format, decode;
  int crop = 0, w = 0, h = 0, max_diff = 0;
  double mean_diff = 0, shifted = 0;
  int n = 0;
  while (lines >> format >> crop >> decode >> w >> h >> mean_diff >> max_diff >> shifted) {
    ++n;
    std::printf("eval transform vs torchvision: %s %dx%d crop %d (%s): mean |diff| %.3f, max %d; the crop moved by "
                "1-2 px: mean |diff| >= %.3f\n",
                format.c_str(), w, h, crop, decode.c_str(), mean_diff, max_diff, shifted);
    const std::string what =
        format + " " + std::to_string(w) + "x" + std::to_string(h) + " crop " + std::to_string(crop) + " " + decode;
    EXPECT_LT(mean_diff, shifted) << what;  // torchvision's window, not one next to it
    if (format == "png") {
      EXPECT_LE(max_diff, 1) << what;  // the same pixels up to fixed-point rounding
      EXPECT_LT(mean_diff, 0.05) << what;
    } else if (decode == "accurate" && crop == 224) {
      EXPECT_LT(mean_diff, 0.5) << what;  // libjpeg-turbo's accurate IDCT at full or 6/8 scale: as PIL's
    } else {
      // The decoder's own shortcuts, not the transform: 1/8 DCT scaling (crop 32 from a few
      // hundred pixels: an 8×8 box, then the resize) or the fast IDCT with merged chroma
      // upsampling (magnified when a 64-pixel image is upscaled to 256). Measured 1.1-7.6.
      EXPECT_LT(mean_diff, 10.0) << what;
    }
  }
  EXPECT_EQ(n, static_cast<int>(cases.size() * sizes.size())) << out;
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
  test::expect_bad_input([&] { Loader(std::make_shared<ThirstyPipeline>(), DistributedSampler(10, false, 0), o); },
                         {"ulimit -n", "open files"});
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

// A channels-first batch has its planes written by the resize itself (no transposing pass):
// every sample equals the [h, w, c] one transposed, for training and evaluation crops, RGB and
// BGR, the decoded cache and none, JPEG and PNG — and with an augmentation policy after the flip,
// which works on either layout.
TEST(ImagePipeline, ChannelsFirstSamplesAreTheTransposeD3) {
  test::TempDir d;
  make_folder(d.path(), 12);
  auto src = std::shared_ptr<const SampleSource>(open_image_folder(d.path()));
  const int crop = 20;
  const size_t plane = crop * crop;
  int checked = 0;
  for (bool train : {true, false}) {
    for (ColorOrder order : {ColorOrder::kRGB, ColorOrder::kBGR}) {
      for (CacheMode cache : {CacheMode::kNone, CacheMode::kDecoded}) {
        ImagePipelineOptions o = options(crop);
        AugmentOptions augment;
        augment.name = "randaugment";
        augment.interpolation = "bilinear";
        augment.fill.set = true;
        augment.fill.value = {30.0f, 140.0f, 250.0f};
        if (cache == CacheMode::kNone) o.transforms.push_back(make_augment(augment));
        o.train = train;
        o.order = order;
        o.cache = cache;
        o.cache_bytes = int64_t{64} << 20;
        ImagePipeline p(src, o);
        for (int64_t i = 0; i < p.size(); ++i) {
          std::vector<uint8_t> hwc(plane * 3), chw(plane * 3);
          const int64_t a = p.produce(i, 1, hwc.data());
          const int64_t b = p.produce_channels_first(i, 1, chw.data());
          ASSERT_EQ(a, b);
          for (size_t q = 0; q < plane; ++q) {
            for (size_t c = 0; c < 3; ++c) {
              ASSERT_EQ(chw[c * plane + q], hwc[q * 3 + c])
                  << "sample " << i << " train " << train << " order " << color_order_name(order) << " cache "
                  << cache_mode_name(cache) << " pixel " << q << " channel " << c;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 8 * 12);
}

}  // namespace
}  // namespace crucible::data
