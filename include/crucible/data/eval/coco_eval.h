// COCO's box evaluation, as pycocotools' COCOeval(iouType="bbox") computes it: per image and
// category, detections sorted by score (stable) and cut at maxDets[-1]; IoUs as maskApi's bbIou
// (a crowd box's union is the detection's area); greedy matching at each of the 10 IoU thresholds
// 0.50:0.05:0.95 (a crowd or out-of-range box is an ignored match, matched boxes taken by a
// better score first); the 101-point interpolated precision and the recall for every category,
// area range (all, small < 32², medium < 96², large) and maxDets (1, 10, 100); the 12 summary
// numbers as COCOeval.summarize() prints them (-1 where nothing was there to measure). Its quirks
// kept: ground truth areas are the file's "area", a detection's is w·h; a match is recorded by
// the matched box's id, so a ground truth box with id 0 never counts as matched. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::data {

// A COCO instances file's ground truth as pycocotools reads it (boxes as in the file, xywh).
struct CocoGroundTruth {
  struct Box {
    int64_t id = 0, image_id = 0, category_id = 0;
    double bbox[4] = {0, 0, 0, 0};  // x, y, w, h
    double area = 0;                // the file's "area"
    bool iscrowd = false;
  };
  std::vector<int64_t> image_ids;     // every image's id, sorted (images without boxes too)
  std::vector<int64_t> category_ids;  // sorted
  std::vector<Box> boxes;             // in the file's order
};

// bad_input naming the file and the annotation for a missing or mistyped field.
CocoGroundTruth read_coco_ground_truth(const std::string& json_path);

// One detection, as a COCO results file holds it (loadRes): image, category, xywh box, score.
struct CocoDetection {
  int64_t image_id = 0, category_id = 0;
  double bbox[4] = {0, 0, 0, 0};
  double score = 0;
};

// A results file: a JSON list of {"image_id", "category_id", "bbox", "score"}. bad_input naming
// the file and the entry for a missing field, or an image id the ground truth does not have (as
// loadRes refuses it).
std::vector<CocoDetection> read_coco_results(const std::string& json_path, const CocoGroundTruth& gt);

struct CocoEvalResult {
  // AP, AP50, AP75, AP small, medium, large; AR@1, AR@10, AR@100, AR small, medium, large.
  std::array<double, 12> stats{};
  // COCOeval.eval's arrays, C order: precision [T=10, R=101, K, A=4, M=3], recall [T, K, A, M];
  // -1 where a (category, area, maxDets) had no ground truth to measure.
  std::vector<double> precision, recall;
  int64_t categories = 0;
  std::string summary() const;  // the 12 lines COCOeval.summarize() prints
};

// The 12 numbers' names where crucible writes them (metrics.jsonl, summary.json, TensorBoard,
// the report), in `stats` order: AP, AP50, AP75, AP_small, AP_medium, AP_large, AR1, AR10, AR100,
// AR_small, AR_medium, AR_large.
const std::array<const char*, 12>& coco_stat_names();

// bad_input for a detection whose image or category the ground truth does not list.
CocoEvalResult coco_evaluate(const CocoGroundTruth& gt, const std::vector<CocoDetection>& detections);

}  // namespace crucible::data
