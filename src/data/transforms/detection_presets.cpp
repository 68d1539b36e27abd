// The detection presets' registry (see detection_presets.h): one entry per preset, built from
// the transforms' own files.
#include "crucible/data/transforms/detection_presets.h"

#include "crucible/core/config.h"
#include "crucible/data/data_config.h"
#include "crucible/data/transforms/detection_color.h"
#include "crucible/data/transforms/detection_crop.h"
#include "crucible/data/transforms/detection_resize.h"

namespace crucible::data {
namespace {

double hflip_prob(const DataConfig& c) { return c.pieces.get<RandomHorizontalFlipOptions>("hflip").p; }

// Every preset ends as DetectionPresetTrain(use_v2=True) does: SanitizeBoundingBoxes().
DetectionTransforms sanitized(DetectionTransforms chain) {
  chain.push_back(std::make_shared<SanitizeBoundingBoxes>());
  return chain;
}

}  // namespace

void declare_settings(ConfigSchema& s, DetectionSettings& o) {
  s.add("data", "detection_preset", &o.preset,
        "detection: the training transforms of torchvision's references/detection/presets.py "
        "(DetectionPresetTrain's data_augmentation), then SanitizeBoundingBoxes")
      .choices(detection_preset_registry().names())
      .arg("data_augmentation");
  s.add("data", "bad_boxes", &o.bad_boxes,
        "detection: a box reaching outside its image or without area: clip it to the image (and drop it if "
        "nothing is left), drop it, or refuse the data set naming the annotation; the counts are logged")
      .choices({"clamp", "drop", "refuse"});
  s.add("data", "max_boxes", &o.max_boxes,
        "detection: the most boxes one image may hold; more is refused naming the image (T16: memory grows with "
        "the boxes of one image)")
      .min(1);
  s.add("data", "images_root", &o.images_root,
        "detection: the folder a COCO training file's file_names are relative to (empty: beside the file, or COCO's "
        "layout annotations/instances_<split>.json → <split>/)");
  s.add("data", "test_images_root", &o.test_images_root, "detection: data.images_root for the evaluation file");
  s.add("data", "size_divisible", &o.size_divisible,
        "detection: a batch's images are padded to a height and width that are multiples of this "
        "(GeneralizedRCNNTransform's size_divisible)")
      .min(1);
  s.add("data", "aspect_ratio_group_factor", &o.aspect_ratio_group_factor,
        "detection: training batches hold images of one aspect-ratio group, 2k + 1 bins from 1/2 to 2 "
        "(torchvision's GroupedBatchSampler with create_aspect_ratio_groups(k)); -1: batches as the sampler gives them")
      .min(-1)
      .max(1000)
      .arg("aspect_ratio_group_factor");
  s.add("data", "detection_fill", &o.fill,
        "detection: the colour the presets pad with (references' mean: RandomZoomOut, FixedSizeCrop), RGB levels");
  s.add("data", "lsj_size", &o.lsj_size,
        "detection: the \"lsj\" preset's target and crop size, square (references: 1024; smaller for quick runs)")
      .min(1)
      .max(1 << 16);
  declare_settings(s, o.yolox);  // data.yolox_* (yolox.h)
}

const Registry<DetectionPreset>& detection_preset_registry() {
  static const Registry<DetectionPreset> registry = [] {
    Registry<DetectionPreset> r("detection preset");
    r.add("hflip", "RandomHorizontalFlip(data.hflip)",
          {[](const DataConfig& c) { return sanitized({std::make_shared<DetectionHorizontalFlip>(hflip_prob(c))}); },
           nullptr, nullptr});
    r.add("ssd",
          "RandomPhotometricDistort(), RandomZoomOut(fill=data.detection_fill), RandomIoUCrop(), "
          "RandomHorizontalFlip(data.hflip)",
          {[](const DataConfig& c) {
             detection::ZoomOutOptions zoom;
             zoom.fill = c.pieces.get<DetectionSettings>(kDetectionPiece).fill;
             return sanitized({std::make_shared<RandomPhotometricDistort>(), std::make_shared<RandomZoomOut>(zoom),
                               std::make_shared<RandomIoUCrop>(),
                               std::make_shared<DetectionHorizontalFlip>(hflip_prob(c))});
           },
           nullptr, nullptr});
    r.add("ssdlite", "RandomIoUCrop(), RandomHorizontalFlip(data.hflip)",
          {[](const DataConfig& c) {
             return sanitized({std::make_shared<RandomIoUCrop>(), std::make_shared<DetectionHorizontalFlip>(hflip_prob(c))});
           },
           nullptr, nullptr});
    r.add("lsj",
          "ScaleJitter((data.lsj_size, data.lsj_size)), FixedSizeCrop(data.lsj_size, fill=data.detection_fill), "
          "RandomHorizontalFlip(data.hflip); batches of data.lsj_size squares",
          {[](const DataConfig& c) {
             const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
             const int size = static_cast<int>(d.lsj_size);
             return sanitized({std::make_shared<ScaleJitter>(size, size), std::make_shared<FixedSizeCrop>(size, size, d.fill),
                               std::make_shared<DetectionHorizontalFlip>(hflip_prob(c))});
           },
           nullptr,
           [](const DataConfig& c) {
             const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
             const int size = static_cast<int>(d.lsj_size);
             return DetectionBatchLayout{static_cast<int>(d.size_divisible), size, size, 0};
           }});
    r.add("multiscale", "RandomShortestSize(480, 512, ..., 800; max_size=1333), RandomHorizontalFlip(data.hflip)",
          {[](const DataConfig& c) {
             std::vector<int> sizes;
             for (int m = 480; m <= 800; m += 32) sizes.push_back(m);
             return sanitized({std::make_shared<RandomShortestSize>(sizes, 1333),
                               std::make_shared<DetectionHorizontalFlip>(hflip_prob(c))});
           },
           nullptr, nullptr});
    r.add(kYoloxPreset,
          "YOLOX (yolox 0.3.0's MosaicDetection): mosaic + random_affine + mixup (data.yolox_*), then TrainTransform "
          "(HSV, flip data.hflip, letterbox); batches of data.yolox_size squares, fill 114; evaluation: the letterbox",
          {[](const DataConfig& c) {
             const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
             return DetectionTransforms{std::make_shared<YoloxTrain>(d.yolox, hflip_prob(c))};
           },
           [](const DataConfig& c) {
             const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
             return DetectionTransforms{std::make_shared<YoloxLetterbox>(static_cast<int>(d.yolox.size))};
           },
           [](const DataConfig& c) {
             const int size = static_cast<int>(c.pieces.get<DetectionSettings>(kDetectionPiece).yolox.size);
             return DetectionBatchLayout{32, size, size, 114};
           },
           /*aspect_groups=*/false});
    return r;
  }();
  return registry;
}

SourceOptions detection_source_options(const DataConfig& c, bool train) {
  const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
  SourceOptions o;
  o.boxes.bad = parse_bad_box_policy(d.bad_boxes, "data.bad_boxes");
  o.boxes.max_boxes = d.max_boxes;
  o.images_root = train ? d.images_root : d.test_images_root;
  return o;
}

}  // namespace crucible::data
