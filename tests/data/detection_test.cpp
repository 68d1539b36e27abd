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
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/loader/collate.h"
#include "crucible/data/loader/detection_pipeline.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/samplers/sampler.h"
#include "test_util.h"

namespace crucible::data {
namespace {

using json = nlohmann::json;
using test::TempDir;

void write_jpeg(const std::string& path, int width, int height, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (auto& v : rgb) v = static_cast<uint8_t>(gen());
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), width, height, 90);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(jpeg.data()),
                                              static_cast<std::streamsize>(jpeg.size()));
}

// A COCO set in `dir`: images (id, width, height) written as JPEGs beside the JSON, with `annotations`.
std::string write_coco(const TempDir& dir, const std::vector<std::tuple<int64_t, int, int>>& images, json annotations,
                       json categories = json::array({{{"id", 7}, {"name", "triangle"}},
                                                      {{"id", 1}, {"name", "rectangle"}},
                                                      {{"id", 3}, {"name", "ellipse"}}})) {
  json j;
  j["images"] = json::array();
  for (const auto& [id, w, h] : images) {
    const std::string name = "img" + std::to_string(id) + ".jpg";
    write_jpeg(dir / name, w, h, static_cast<uint32_t>(id));
    j["images"].push_back({{"id", id}, {"file_name", name}, {"width", w}, {"height", h}});
  }
  j["annotations"] = std::move(annotations);
  j["categories"] = std::move(categories);
  const std::string path = dir / "instances.json";
  std::ofstream(path) << j.dump();
  return path;
}

json ann(int64_t id, int64_t image, int64_t category, std::vector<double> bbox, int crowd = 0) {
  const double area = bbox.size() == 4 ? bbox[2] * bbox[3] : 0.0;  // a malformed bbox is a test case too
  return {{"id", id},     {"image_id", image}, {"category_id", category}, {"bbox", bbox},
          {"iscrowd", crowd}, {"area", area}, {"segmentation", json::array({json::array({1, 2, 3, 4, 5, 6})})}};
}

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

}  // namespace
}  // namespace crucible::data
