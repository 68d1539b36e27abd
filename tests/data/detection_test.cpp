// Detection data: the COCO and YOLO sources (order, label mapping, boxes, every bad input named),
// the detection pipeline's checks, the collation of padded batches, and the loader's law 1 for
// detection batches (any thread count, resumed mid-epoch). The comparisons with torchvision and
// pycocotools are in tests/python/test_detection_data.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "crucible/core/error.h"
#include "crucible/data/formats/json_target.h"
#include "crucible/data/formats/pack.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/loader/collate.h"
#include "crucible/data/loader/detection_pipeline.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/samplers/sampler.h"
#include "coco_fixture.h"
#include "test_util.h"

namespace crucible::data {
namespace {

using json = nlohmann::json;
using test::TempDir;

using test::ann;
using test::write_coco;
using test::write_jpeg;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::vector<float> boxes_of(const SampleSource& s, int64_t i) { return s.get(i).boxes->xyxy; }

TEST(DetectionSource, CocoImagesInIdOrderAndCategoriesContiguousD16) {
  TempDir dir;
  const std::string path = write_coco(dir, {{30, 40, 30}, {10, 50, 20}, {20, 24, 24}},
                                      json::array({ann(5, 30, 7, {1.5, 2, 10, 5}), ann(6, 10, 1, {0, 0, 50, 20}, 1),
                                                   ann(9, 30, 3, {20, 10, 4.25, 7})}));
  const auto s = open_samples(path);  // the format is found from the .json
  ASSERT_TRUE(s->has_boxes());
  EXPECT_FALSE(s->exif_orientation());  // COCO's boxes are in the stored pixels, as PIL reads them
  ASSERT_EQ(s->size(), 3);
  // torchvision's CocoDetection order: sorted image ids; categories by id become 0, 1, 2.
  EXPECT_EQ(s->get(0).image_id, 10);
  EXPECT_EQ(s->get(1).image_id, 20);
  EXPECT_EQ(s->get(2).image_id, 30);
  EXPECT_EQ(s->classes(), (std::vector<std::string>{"rectangle", "ellipse", "triangle"}));
  EXPECT_EQ(s->category_ids(), (std::vector<int64_t>{1, 3, 7}));
  const EncodedSample a = s->get(0);
  EXPECT_EQ(a.boxes->labels, (std::vector<int64_t>{0}));
  EXPECT_EQ(a.boxes->iscrowd, (std::vector<uint8_t>{1}));
  EXPECT_TRUE(s->get(1).boxes->empty());  // no annotation: a background image
  const EncodedSample c = s->get(2);
  EXPECT_EQ(c.boxes->labels, (std::vector<int64_t>{2, 1}));  // file order within the image
  EXPECT_EQ(c.boxes->ids, (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(c.boxes->xyxy, (std::vector<float>{1.5f, 2, 11.5f, 7, 20, 10, 24.25f, 17}));
  int w = 0, h = 0;
  ASSERT_TRUE(s->image_size(0, &w, &h));
  EXPECT_EQ(w, 50);
  EXPECT_EQ(h, 20);
  EXPECT_EQ(c.width, 40);
  EXPECT_EQ(c.height, 30);
}

// data.train_samples / data.test_samples on a detection set: the evenly spaced subset is still a
// detection source — boxes, the file's category ids, each image's size by the subset's index,
// the box counts and the EXIF rule are the base's.
TEST(DetectionSource, AnEvenlySpacedSubsetKeepsTheBoxesAndCategoryIds) {
  TempDir dir;
  const std::string path = write_coco(dir, {{30, 40, 30}, {10, 50, 20}, {20, 24, 24}, {40, 16, 12}},
                                      json::array({ann(5, 30, 7, {1.5, 2, 10, 5}), ann(6, 10, 1, {0, 0, 50, 20}),
                                                   ann(9, 40, 3, {2, 1, 4, 7})}));
  const std::shared_ptr<const SampleSource> base = open_samples(path);
  const auto sub = subset_evenly(base, 2);  // images 0 and 2 of 4: ids 10 and 30
  ASSERT_TRUE(sub->has_boxes());
  EXPECT_FALSE(sub->exif_orientation());
  EXPECT_EQ(sub->category_ids(), base->category_ids());
  EXPECT_EQ(sub->get(1).image_id, 30);
  EXPECT_EQ(boxes_of(*sub, 1), boxes_of(*base, 2));
  int w = 0, h = 0;
  ASSERT_TRUE(sub->image_size(1, &w, &h));
  EXPECT_EQ(w, 40);  // image 30's, not image 20's (24 × 24)
  EXPECT_EQ(h, 30);
  EXPECT_FALSE(sub->image_size(2, &w, &h));
  EXPECT_GT(base->box_counts().kept, 0);
  EXPECT_EQ(sub->box_counts().kept, base->box_counts().kept);
}

TEST(DetectionSource, CocoBadInputNamesTheFileAndTheAnnotation) {
  TempDir dir;
  const std::vector<std::tuple<int64_t, int, int>> images = {{1, 32, 32}};
  auto open = [&](json anns, const SourceOptions& o = {}) {
    const std::string p = write_coco(dir, images, std::move(anns));
    return error_of([&] { open_coco(p, o); });
  };
  std::string e = open(json::array({ann(5, 99, 1, {0, 0, 4, 4})}));
  EXPECT_NE(e.find("instances.json"), std::string::npos) << e;
  EXPECT_NE(e.find("annotation 5"), std::string::npos) << e;
  EXPECT_NE(e.find("image_id 99"), std::string::npos) << e;
  e = open(json::array({ann(6, 1, 42, {0, 0, 4, 4})}));
  EXPECT_NE(e.find("annotation 6"), std::string::npos) << e;
  EXPECT_NE(e.find("category_id 42"), std::string::npos) << e;
  EXPECT_NE(e.find("1, 3, 7"), std::string::npos) << e;  // the ids it has
  e = open(json::array({ann(7, 1, 1, {0, 0, 4})}));
  EXPECT_NE(e.find("annotation 7: bbox has 3 numbers"), std::string::npos) << e;
  json bad_type = ann(8, 1, 1, {0, 0, 4, 4});
  bad_type["bbox"] = "0 0 4 4";
  e = open(json::array({bad_type}));
  EXPECT_NE(e.find("annotation 8"), std::string::npos) << e;
  EXPECT_NE(e.find("bbox"), std::string::npos) << e;
  SourceOptions few;
  few.boxes.max_boxes = 2;
  e = open(json::array({ann(1, 1, 1, {0, 0, 4, 4}), ann(2, 1, 1, {1, 0, 4, 4}), ann(3, 1, 1, {2, 0, 4, 4})}), few);
  EXPECT_NE(e.find("image 1 (img1.jpg)"), std::string::npos) << e;
  EXPECT_NE(e.find("data.max_boxes = 2"), std::string::npos) << e;
  // Not a COCO file: what it has is named.
  const std::string other = dir / "other.json";
  std::ofstream(other) << R"({"info": {}, "licenses": []})";
  e = error_of([&] { open_samples(other); });
  EXPECT_NE(e.find("\"info\", \"licenses\""), std::string::npos) << e;
  // Images that are nowhere: the places tried, and the key that says where.
  json moved = json::parse(std::ifstream(write_coco(dir, images, json::array())));
  moved["images"][0]["file_name"] = "elsewhere/img1.jpg";
  std::ofstream(dir / "moved.json") << moved.dump();
  e = error_of([&] { open_coco(dir / "moved.json", {}); });
  EXPECT_NE(e.find("elsewhere/img1.jpg"), std::string::npos) << e;
  EXPECT_NE(e.find("data.images_root"), std::string::npos) << e;
}

TEST(DetectionSource, BadBoxesAreClampedDroppedOrRefusedAndCountedD15) {
  TempDir dir;
  const std::string p = write_coco(dir, {{1, 40, 30}},
                                   json::array({ann(1, 1, 1, {35, 20, 10, 20}),    // reaches past the right and bottom
                                                ann(2, 1, 1, {5, 5, -3, 4}),      // negative width
                                                ann(3, 1, 1, {45, 5, 4, 4}),      // wholly outside
                                                ann(4, 1, 3, {2, 3, 4, 5})}));    // fine
  SourceOptions o;
  o.boxes.bad = BadBoxPolicy::kClamp;
  auto clamp = open_coco(p, o);
  EXPECT_EQ(boxes_of(*clamp, 0), (std::vector<float>{35, 20, 40, 30, 2, 3, 6, 8}));
  EXPECT_EQ(clamp->box_counts().kept, 2);
  EXPECT_EQ(clamp->box_counts().clamped, 1);
  EXPECT_EQ(clamp->box_counts().dropped, 2);
  o.boxes.bad = BadBoxPolicy::kDrop;
  auto drop = open_coco(p, o);
  EXPECT_EQ(boxes_of(*drop, 0), (std::vector<float>{2, 3, 6, 8}));
  EXPECT_EQ(drop->box_counts().dropped, 3);
  o.boxes.bad = BadBoxPolicy::kRefuse;
  const std::string e = error_of([&] { open_coco(p, o); });
  EXPECT_NE(e.find("annotation 1"), std::string::npos) << e;
  EXPECT_NE(e.find("reaches outside its image of 40x30"), std::string::npos) << e;
  EXPECT_NE(e.find("data.bad_boxes"), std::string::npos) << e;
}

// A YOLO set: <root>/images/train/*.jpg, <root>/labels/train/*.txt.
std::string write_yolo(const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& images_and_labels,
                       const std::string& classes = "") {
  const std::string images = dir / "set/images/train", labels = dir / "set/labels/train";
  std::filesystem::create_directories(images);
  std::filesystem::create_directories(labels);
  uint32_t seed = 1;
  for (const auto& [name, text] : images_and_labels) {
    write_jpeg(images + "/" + name + ".jpg", 50, 20, seed++);
    if (text != "<none>") std::ofstream(labels + "/" + name + ".txt") << text;
  }
  if (!classes.empty()) std::ofstream(dir / "set/classes.txt") << classes;
  return images;
}

TEST(DetectionSource, YoloLabelsBecomePixelsAndBadLinesAreNamed) {
  TempDir dir;
  const std::string images = write_yolo(dir, {{"a", "1 0.5 0.5 0.2 0.5\n0 0.1 0.25 0.2 0.5\n"}, {"b", "<none>"}, {"c", ""}},
                                        "cat\ndog\n");
  const auto s = open_samples(images);  // found from the images/labels layout
  ASSERT_TRUE(s->has_boxes());
  ASSERT_EQ(s->size(), 3);
  EXPECT_EQ(s->classes(), (std::vector<std::string>{"cat", "dog"}));
  const EncodedSample a = s->get(0);
  // 50x20 image: cx 0.5 → 25, w 0.2 → 10; cy 0.5 → 10, h 0.5 → 10.
  const std::vector<float> want = {20, 5, 30, 15, 0, 0, 10, 10};
  ASSERT_EQ(a.boxes->xyxy.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a.boxes->xyxy[i], want[i], 1e-5) << i;  // float32 products
  EXPECT_EQ(a.boxes->labels, (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(s->get(1).boxes->empty());  // no label file: background
  EXPECT_TRUE(s->get(2).boxes->empty());  // an empty one too

  auto error = [&](const std::string& text, const std::string& classes = "") {
    TempDir d;
    const std::string p = write_yolo(d, {{"x", text}}, classes);
    return error_of([&] { open_yolo(p, {}); });
  };
  std::string e = error("0 0.5 0.5 0.2\n");
  EXPECT_NE(e.find("labels/train/x.txt:1: 4 columns"), std::string::npos) << e;
  e = error("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2 0.1 0.1 0.3\n");
  EXPECT_NE(e.find("x.txt:2: 8 columns"), std::string::npos) << e;
  EXPECT_NE(e.find("segment"), std::string::npos) << e;
  e = error("0 0.5 half 0.2 0.2\n");
  EXPECT_NE(e.find("x.txt:1: \"half\" is not a number"), std::string::npos) << e;
  e = error("2 0.5 0.5 0.2 0.2\n", "cat\ndog\n");
  EXPECT_NE(e.find("x.txt:1: class 2"), std::string::npos) << e;
  EXPECT_NE(e.find("classes.txt names 2 classes"), std::string::npos) << e;
  e = error("-1 0.5 0.5 0.2 0.2\n");
  EXPECT_NE(e.find("class \"-1\""), std::string::npos) << e;
}

DetectionPipelineOptions flip_options(double p) {
  DetectionPipelineOptions o;
  o.preset = "test";
  o.transforms = {std::make_shared<DetectionHorizontalFlip>(p), std::make_shared<SanitizeBoundingBoxes>()};
  o.augment_seed = 1234;
  return o;
}

TEST(DetectionPipeline, AnImageOfAnotherSizeThanItsAnnotationsIsRefusedD17) {
  TempDir dir;
  const std::string p = write_coco(dir, {{1, 40, 30}}, json::array({ann(1, 1, 1, {2, 2, 4, 4})}));
  write_jpeg(dir / "img1.jpg", 30, 40, 1);  // rotated since it was annotated
  DetectionPipeline pipeline(open_coco(p, {}), flip_options(0));
  const std::string e = error_of([&] { pipeline.produce_detection(0, 0, nullptr); });
  EXPECT_NE(e.find("img1.jpg: the image is 30x40 pixels but its annotations say 40x30"), std::string::npos) << e;
}

TEST(DetectionPipeline, RefusesASourceWithoutBoxes) {
  TempDir dir;
  std::filesystem::create_directories(dir / "folder/cls");
  write_jpeg(dir / "folder/cls/a.jpg", 8, 8, 1);
  EXPECT_NE(error_of([&] { DetectionPipeline(open_samples(dir / "folder"), flip_options(0)); }).find("carry boxes"),
            std::string::npos);
}

TEST(DetectionCollate, PadsToAMultipleOfSizeDivisibleAndPacksBoxesD18) {
  DetectionImage a, b;
  a.width = 33, a.height = 20;
  a.pixels.assign(33 * 20 * 3, 7);
  a.boxes.add(1, 2, 3, 4, 0, false, 0);
  b.width = 10, b.height = 40;
  b.pixels.assign(10 * 40 * 3, 9);
  b.boxes.add(5, 6, 7, 8, 2, true, 0);
  b.boxes.add(1, 1, 2, 2, 1, false, 1);
  std::vector<DetectionImage> images = {a, b};
  Batch hwc, chw;
  collate_detection(images, DetectionBatchLayout{32, 0, 0, 0}, false, PixelBuffer::heap, &hwc);
  collate_detection(images, DetectionBatchLayout{32, 0, 0, 0}, true, PixelBuffer::heap, &chw);
  EXPECT_EQ(hwc.spec.height, 64);  // 40 → 64
  EXPECT_EQ(hwc.spec.width, 64);   // 33 → 64
  EXPECT_EQ(hwc.image_sizes, (std::vector<int64_t>{20, 33, 40, 10}));
  EXPECT_EQ(hwc.box_offsets, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(hwc.boxes, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 2, 2}));
  EXPECT_EQ(hwc.box_labels, (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(hwc.box_crowd, (std::vector<uint8_t>{0, 1, 0}));
  const uint8_t* p = hwc.pixels.data();
  auto at = [&](int n, int y, int x, int c) { return p[((n * 64 + y) * 64 + x) * 3 + c]; };
  auto at_chw = [&](int n, int y, int x, int c) { return chw.pixels.data()[((n * 3 + c) * 64 + y) * 64 + x]; };
  for (int n = 0; n < 2; ++n) {
    const DetectionImage& im = images[n];
    for (int y = 0; y < 64; ++y) {
      for (int x = 0; x < 64; ++x) {
        for (int c = 0; c < 3; ++c) {
          const int want = y < im.height && x < im.width ? im.pixels[0] : 0;
          ASSERT_EQ(at(n, y, x, c), want) << n << " " << y << " " << x;
          ASSERT_EQ(at_chw(n, y, x, c), want) << n << " " << y << " " << x;
        }
      }
    }
  }
  // A fixed layout keeps its size whatever the images'.
  Batch fixed;
  std::vector<DetectionImage> one = {a};
  one[0].width = 40, one[0].height = 40, one[0].pixels.assign(40 * 40 * 3, 1);
  collate_detection(one, DetectionBatchLayout{32, 40, 40, 114}, false, PixelBuffer::heap, &fixed);
  EXPECT_EQ(fixed.spec.height, 40);
  EXPECT_EQ(fixed.spec.width, 40);
}

// Every field of a detection batch, for equality.
std::string fingerprint(const Batch& b) {
  std::string s(reinterpret_cast<const char*>(b.pixels.data()), b.pixels.size());
  auto add = [&](const auto& v) { s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])); };
  add(b.sample_ids), add(b.image_sizes), add(b.image_ids), add(b.boxes), add(b.box_labels), add(b.box_crowd),
      add(b.box_offsets);
  return s + std::to_string(b.spec.height) + "x" + std::to_string(b.spec.width);
}

std::vector<std::string> epoch_batches(const std::shared_ptr<const SamplePipeline>& pipeline, int threads, int64_t epoch,
                                       int64_t first) {
  LoaderOptions o;
  o.batch_size = 4;
  o.threads = threads;
  Loader loader(pipeline, DistributedSampler(pipeline->size(), /*shuffle=*/true, 99), o);
  loader.start_epoch(epoch, first);
  std::vector<std::string> out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(b->detection);
    out.push_back(fingerprint(*b));
  }
  return out;
}

TEST(DetectionLoader, BatchesAreTheSameForAnyThreadCountAndResumedMidEpoch) {
  TempDir dir;
  std::vector<std::tuple<int64_t, int, int>> images;
  json anns = json::array();
  std::mt19937 gen(5);
  for (int64_t i = 0; i < 14; ++i) {
    const int w = 20 + static_cast<int>(gen() % 40), h = 20 + static_cast<int>(gen() % 40);
    images.emplace_back(100 + i, w, h);
    for (int k = 0; k < static_cast<int>(i % 4); ++k) {
      anns.push_back(ann(i * 10 + k, 100 + i, 1 + 2 * (k % 2), {double(k), double(k), w / 2.0, h / 3.0}));
    }
  }
  auto pipeline = std::make_shared<DetectionPipeline>(open_coco(write_coco(dir, images, anns), {}), flip_options(0.5));
  const auto one = epoch_batches(pipeline, 1, 1, 0);
  ASSERT_EQ(one.size(), 4u);  // 14 images in batches of 4
  EXPECT_EQ(epoch_batches(pipeline, 4, 1, 0), one);
  const auto resumed = epoch_batches(pipeline, 3, 1, 2);
  EXPECT_EQ(resumed, std::vector<std::string>(one.begin() + 2, one.end()));
  EXPECT_NE(epoch_batches(pipeline, 2, 2, 0), one);  // another epoch: another order and other flips
}

// ---- per-sample JSON targets: packed sets and WebDataset shards ------------------------------

// A COCO set with what every source must carry over: background images, a crowd box, a box
// that overhangs its image (clamped), fractional coordinates, non-contiguous category ids.
std::string varied_coco(const TempDir& dir) {
  std::vector<std::tuple<int64_t, int, int>> images;
  json anns = json::array();
  std::mt19937 gen(11);
  for (int64_t i = 0; i < 12; ++i) {
    const int w = 24 + static_cast<int>(gen() % 50), h = 24 + static_cast<int>(gen() % 50);
    images.emplace_back(500 - 7 * i, w, h);
    for (int k = 0; k < static_cast<int>(i % 5); ++k) {
      anns.push_back(ann(i * 10 + k, 500 - 7 * i, std::vector<int>{7, 1, 3}[k % 3],
                         {k + 0.25, k * 1.5, w / 3.0, h / 2.7}, k == 3 ? 1 : 0));
    }
  }
  anns.push_back(ann(999, 500, 3, {10, 10, 100, 5}));  // past the right edge: clamped
  return write_coco(dir, images, anns);
}

std::string bytes_of(const EncodedSample& s) { return std::string(reinterpret_cast<const char*>(s.data), s.size); }

// Sample by sample: the same bytes, image id, size, boxes (bit for bit), labels, crowd flags and
// annotation ids; the same classes, category ids and box counts.
void expect_same_detection_set(const SampleSource& want, const SampleSource& got) {
  ASSERT_TRUE(got.has_boxes()) << got.describe();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.classes(), want.classes());
  EXPECT_EQ(got.category_ids(), want.category_ids());
  EXPECT_EQ(got.exif_orientation(), want.exif_orientation());
  for (int64_t i = 0; i < want.size(); ++i) {
    const EncodedSample a = want.get(i), b = got.get(i);
    EXPECT_EQ(bytes_of(b), bytes_of(a)) << b.name;
    EXPECT_EQ(b.image_id, a.image_id) << b.name;
    EXPECT_EQ(b.width, a.width) << b.name;
    EXPECT_EQ(b.height, a.height) << b.name;
    ASSERT_NE(b.boxes, nullptr) << b.name;
    EXPECT_EQ(b.boxes->xyxy, a.boxes->xyxy) << b.name;
    EXPECT_EQ(b.boxes->labels, a.boxes->labels) << b.name;
    EXPECT_EQ(b.boxes->iscrowd, a.boxes->iscrowd) << b.name;
    EXPECT_EQ(b.boxes->ids, a.boxes->ids) << b.name;
    int w = 0, h = 0;
    ASSERT_TRUE(got.image_size(i, &w, &h));
    EXPECT_EQ(w, a.width);
    EXPECT_EQ(h, a.height);
  }
}

TEST(DetectionShards, APackedCocoSetReadsAsItsCocoFileSampleBySample) {
  TempDir dir;
  const auto coco = open_coco(varied_coco(dir), {});
  ASSERT_EQ(coco->box_counts().clamped, 1);
  PackOptions o;
  o.validate = true;  // every image decoded, its size checked against its annotations' (D17)
  o.threads = 3;
  o.shard_bytes = 8192;  // several shards, each target right after its image
  const PackReport r = pack_samples(*coco, dir / "packed", o);
  EXPECT_TRUE(r.bad.empty());
  EXPECT_GE(r.files.size(), 3u);
  const auto packed = open_samples(dir / "packed");
  expect_same_detection_set(*coco, *packed);
  EXPECT_EQ(packed->box_counts().kept, coco->box_counts().kept);  // what the pack's policy did, kept with the set
  EXPECT_EQ(packed->box_counts().clamped, 1);
  EXPECT_NE(packed->describe().find("detection targets"), std::string::npos) << packed->describe();
  // The same batches through the detection pipeline, whatever the source.
  auto from_coco = std::make_shared<DetectionPipeline>(open_coco(dir / "instances.json", {}), flip_options(0.5));
  auto from_pack = std::make_shared<DetectionPipeline>(open_samples(dir / "packed"), flip_options(0.5));
  EXPECT_EQ(epoch_batches(from_pack, 2, 0, 0), epoch_batches(from_coco, 2, 0, 0));
}

TEST(DetectionShards, AReencodedPackScalesTheBoxesWithTheImage) {
  TempDir dir;
  const auto coco = open_coco(varied_coco(dir), {});
  PackOptions o;
  o.mode = PackOptions::Mode::kReencode;
  o.max_side = 32;
  pack_samples(*coco, dir / "small", o);
  const auto small = open_samples(dir / "small");
  ASSERT_TRUE(small->has_boxes());
  for (int64_t i = 0; i < coco->size(); ++i) {
    const EncodedSample a = coco->get(i), b = small->get(i);
    const ImageInfo info = probe_image(b.data, b.size, b.name, false);
    EXPECT_EQ(info.width, b.width) << b.name;  // the record's size is the stored image's
    EXPECT_EQ(info.height, b.height) << b.name;
    EXPECT_EQ(std::max(b.width, b.height), std::max(a.width, a.height) > 32 ? 32 : std::max(a.width, a.height));
    const float sx = static_cast<float>(b.width) / static_cast<float>(a.width);
    const float sy = static_cast<float>(b.height) / static_cast<float>(a.height);
    ASSERT_EQ(b.boxes->size(), a.boxes->size());
    for (size_t k = 0; k < a.boxes->size(); ++k) {
      EXPECT_EQ(b.boxes->xyxy[4 * k], a.boxes->xyxy[4 * k] * sx) << b.name;
      EXPECT_EQ(b.boxes->xyxy[4 * k + 3], a.boxes->xyxy[4 * k + 3] * sy) << b.name;
    }
  }
}

// A WebDataset shard written by Python's tarfile: for each COCO sample, <key>.jpg and <key>.json
// (json_target's object; `sizes` false leaves width and height out, for the header to say).
void write_detection_shard(const SampleSource& coco, const std::string& shard, bool sizes, int64_t first, int64_t end) {
  json samples = json::array();
  for (int64_t i = first; i < end; ++i) {
    const EncodedSample s = coco.get(i);
    json t = json::parse(json_target(*s.boxes, s.image_id, sizes ? s.width : 0, sizes ? s.height : 0));
    std::string hex;
    for (size_t k = 0; k < s.size; ++k) hex += fmt::format("{:02x}", s.data[k]);
    samples.push_back({{"key", fmt::format("img{:04d}", i)}, {"jpg", hex}, {"json", t.dump()}});
  }
  const std::string spec = std::filesystem::path(shard).parent_path().string() + "/spec.json";
  std::ofstream(spec) << samples.dump();
  test::run_python(R"(
import io, json, tarfile
with open()" + json(spec).dump() + R"() as f:
    samples = json.load(f)
with tarfile.open()" + json(shard).dump() + R"(, "w", format=tarfile.GNU_FORMAT) as t:
    for s in samples:
        for ext, data in (("jpg", bytes.fromhex(s["jpg"])), ("json", s["json"].encode()),
                          ("txt", b"a caption")):
            ti = tarfile.TarInfo(s["key"] + "." + ext)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
)");
}

TEST(DetectionShards, WebDatasetShardsWithJsonTargetsReadAsTheCocoFile) {
  TempDir dir;
  const auto coco = open_coco(varied_coco(dir), {});
  // Targets already clamped by the COCO source: the shards' boxes are all inside.
  write_detection_shard(*coco, dir / "det-0.tar", /*sizes=*/true, 0, 5);
  write_detection_shard(*coco, dir / "det-1.tar", /*sizes=*/false, 5, coco->size());
  const auto shards = open_samples(dir / "det-{0..1}.tar");
  // Labels are the targets' class indices (no category ids) and the names are numbered.
  ASSERT_TRUE(shards->has_boxes());
  EXPECT_EQ(shards->classes(), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_TRUE(shards->category_ids().empty());
  EXPECT_FALSE(shards->exif_orientation());
  for (int64_t i = 0; i < coco->size(); ++i) {
    const EncodedSample a = coco->get(i), b = shards->get(i);
    EXPECT_EQ(bytes_of(b), bytes_of(a)) << b.name;
    EXPECT_EQ(b.name, std::string(dir / fmt::format("det-{}.tar", i < 5 ? 0 : 1)) + fmt::format(":img{:04d}", i));
    EXPECT_EQ(b.image_id, a.image_id);
    EXPECT_EQ(b.width, a.width) << b.name;  // from the JSON, or from the image's header
    EXPECT_EQ(b.height, a.height) << b.name;
    EXPECT_EQ(b.boxes->xyxy, a.boxes->xyxy) << b.name;
    EXPECT_EQ(b.boxes->labels, a.boxes->labels) << b.name;
    EXPECT_EQ(b.boxes->iscrowd, a.boxes->iscrowd) << b.name;
  }
  // The sidecar records where the targets are: a second open reads them from it.
  const auto again = open_samples(dir / "det-{0..1}.tar");
  EXPECT_NE(again->describe().find("2 read from .idx, 0 built"), std::string::npos) << again->describe();
  for (int64_t i = 0; i < coco->size(); ++i) EXPECT_EQ(again->get(i).boxes->xyxy, shards->get(i).boxes->xyxy);
  // And the shards pack into a detection set like any other source.
  pack_samples(*again, dir / "packed", {});
  expect_same_detection_set(*again, *open_samples(dir / "packed"));
}

TEST(DetectionShards, AJsonWithoutBoxesIsMetadataAndAClassificationShardStaysOne) {
  TempDir dir;
  const std::string shard = dir / "cls.tar";
  write_jpeg(dir / "a.jpg", 8, 8, 1);
  test::run_python(R"(
import io, tarfile
with tarfile.open()" + json(shard).dump() + R"(, "w") as t:
    for k in range(3):
        for ext, data in (("jpg", open()" + json(std::string(dir / "a.jpg")).dump() + R"(, "rb").read()),
                          ("cls", b"%d" % k), ("json", b'{"caption": "a cat", "width": 8}')):
            ti = tarfile.TarInfo("s%d.%s" % (k, ext))
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
)");
  const auto s = open_samples(shard);
  EXPECT_FALSE(s->has_boxes());
  EXPECT_EQ(s->get(2).label, 2);
  EXPECT_EQ(s->get(2).boxes, nullptr);
}

TEST(DetectionShards, BadTargetsAreNamedBySampleAndBoxD15) {
  TempDir dir;
  write_jpeg(dir / "a.jpg", 20, 10, 1);
  const std::string shard = dir / "bad.tar";
  auto write_shard = [&](const std::vector<std::string>& targets) {
    std::filesystem::remove(shard + ".idx");
    json list = targets;
    test::run_python(R"(
import io, json, tarfile
targets = json.loads()" + json(list.dump()).dump() + R"()
with tarfile.open()" + json(shard).dump() + R"(, "w") as t:
    for k, target in enumerate(targets):
        members = [("jpg", open()" + json(std::string(dir / "a.jpg")).dump() + R"(, "rb").read())]
        if target != "NONE":
            members.append(("json", target.encode()))
        for ext, data in members:
            ti = tarfile.TarInfo("s%d.%s" % (k, ext))
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
)");
  };
  auto shard_with = [&](const std::vector<std::string>& targets, const SourceOptions& o = {}) {
    write_shard(targets);
    return error_of([&] { open_samples(shard, o); });
  };
  const std::string ok = R"({"boxes": [[1, 1, 5, 5]], "labels": [0]})";
  std::string e = shard_with({ok, R"({"boxes": [[1, 1, 5]], "labels": [0]})"});
  EXPECT_NE(e.find("bad.tar:s1.json: box 0 should be [x1, y1, x2, y2] (4 finite numbers), found [1,1,5]"),
            std::string::npos) << e;
  e = shard_with({R"({"boxes": [[1, 1, 5, 5], [2, 2, 3, 3]], "labels": [0]})"});
  EXPECT_NE(e.find(R"(s0.json: "labels" should be a list of a class index >= 0 (one per box, 2 boxes), found 1 entries)"),
            std::string::npos) << e;
  e = shard_with({R"({"boxes": [[1, 1, 5, 5]], "labels": [-2]})"});
  EXPECT_NE(e.find(R"(s0.json: box 0: "labels" should be a class index >= 0, found -2)"), std::string::npos) << e;
  e = shard_with({ok, R"({"boxes": [[1, 1, 5, 5]], "labels": [0], "width": "wide"})"});
  EXPECT_NE(e.find(R"(s1.json: "width" should be the image's width in pixels)"), std::string::npos) << e;
  e = shard_with({ok, "NONE"});  // no .json member
  EXPECT_NE(e.find("bad.tar:s1: the sample has no .json target, but other samples of the set have one"),
            std::string::npos) << e;
  SourceOptions refuse;
  refuse.boxes.bad = BadBoxPolicy::kRefuse;
  e = shard_with({ok, R"({"boxes": [[1, 1, 5, 5], [15, 2, 25, 8]], "labels": [0, 1]})"}, refuse);
  EXPECT_NE(e.find("s1.json: box 1: the box (x1 15, y1 2, x2 25, y2 8) reaches outside its image of 20x10 pixels"),
            std::string::npos) << e;  // the size from the JPEG's header: the JSON gives none
  SourceOptions few;
  few.boxes.max_boxes = 1;
  e = shard_with({R"({"boxes": [[1, 1, 5, 5], [2, 2, 3, 3]], "labels": [0, 0]})"}, few);
  EXPECT_NE(e.find("s0.json: 2 boxes, more than data.max_boxes = 1"), std::string::npos) << e;
  // Dropped and clamped boxes are counted, as a COCO file's are.
  SourceOptions drop;
  drop.boxes.bad = BadBoxPolicy::kDrop;
  write_shard({R"({"boxes": [[1, 1, 5, 5], [15, 2, 25, 8], [3, 3, 3, 9]], "labels": [0, 1, 1], "width": 20, "height": 10})"});
  const auto dropped = open_samples(shard, drop);
  EXPECT_EQ(dropped->box_counts().kept, 1);
  EXPECT_EQ(dropped->box_counts().dropped, 2);
  EXPECT_EQ(dropped->get(0).boxes->size(), 1u);
}

TEST(DetectionShards, ADamagedPackedDetectionIndexIsNamed) {
  TempDir dir;
  pack_samples(*open_coco(varied_coco(dir), {}), dir / "p", {});
  const std::string index = dir / "p/index.crpk";
  std::string raw = test::read_text(index);
  // The last record's target size (u32 at byte 24 of the 40-byte record) set to 0.
  const size_t at = raw.size() - 40 + 24;
  for (int k = 0; k < 4; ++k) raw[at + k] = 0;
  std::ofstream(index, std::ios::binary | std::ios::trunc) << raw;
  const std::string e = error_of([&] { open_samples(dir / "p"); });
  EXPECT_NE(e.find("detection sample 11 has a target of 0 bytes"), std::string::npos) << e;
}

}  // namespace
}  // namespace crucible::data
