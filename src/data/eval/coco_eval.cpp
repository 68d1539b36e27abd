// COCO's box evaluation (coco_eval.h), written after pycocotools' cocoeval.py (evaluate,
// evaluateImg, accumulate, summarize) and maskApi.c's bbIou, in its order of operations.
// Compiled with -ffp-contract=off: numpy's linspace and the IoUs multiply and add apart.
#include "crucible/data/eval/coco_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <unordered_map>
#include <utility>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::data {
namespace {

using json = nlohmann::json;

constexpr int kT = 10, kR = 101, kA = 4, kM = 3;
constexpr int kMaxDets[kM] = {1, 10, 100};
constexpr double kAreaRanges[kA][2] = {{0, 1e10}, {0, 32 * 32}, {32 * 32, 96 * 96}, {96 * 96, 1e10}};

// np.linspace(start, stop, num): i * step + start, the last one stop itself.
std::vector<double> linspace(double start, double stop, int num) {
  std::vector<double> out(num);
  const double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; ++i) out[i] = static_cast<double>(i) * step + start;
  out[num - 1] = stop;
  return out;
}

const std::vector<double>& iou_thresholds() {
  static const std::vector<double> t = linspace(.5, 0.95, static_cast<int>(std::round((0.95 - .5) / .05)) + 1);
  return t;
}
const std::vector<double>& recall_thresholds() {
  static const std::vector<double> r = linspace(.0, 1.00, static_cast<int>(std::round((1.00 - .0) / .01)) + 1);
  return r;
}

json parse(const std::string& path) {
  const std::string raw = read_file(path);  // bad_input naming a missing file
  try {
    return json::parse(raw, [](int depth, json::parse_event_t event, json& parsed) {
      return !(event == json::parse_event_t::key && depth == 3 && parsed == "segmentation");
    });
  } catch (const json::exception& e) {
    throw bad_input("{}: not JSON: {}", path, e.what());
  }
}

template <typename T>
T field(const json& o, const char* key, const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end()) throw bad_input("{}: no \"{}\"", where, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw bad_input("{}: \"{}\" is {}, of the wrong type", where, key, it->dump().substr(0, 80));
  }
}

void read_bbox(const json& o, const std::string& where, double out[4]) {
  const auto b = field<std::vector<double>>(o, "bbox", where);
  if (b.size() != 4) throw bad_input("{}: bbox has {} numbers; expected [x, y, width, height]", where, b.size());
  std::copy(b.begin(), b.end(), out);
}

// maskApi.c's bbIou for one pair (xywh); a crowd box's union is the detection's area.
double box_iou(const double* d, const double* g, bool crowd) {
  const double ga = g[2] * g[3], da = d[2] * d[3];
  const double w = std::fmin(d[2] + d[0], g[2] + g[0]) - std::fmax(d[0], g[0]);
  if (w <= 0) return 0;
  const double h = std::fmin(d[3] + d[1], g[3] + g[1]) - std::fmax(d[1], g[1]);
  if (h <= 0) return 0;
  const double i = w * h;
  const double u = crowd ? da : da + ga - i;
  return i / u;
}

struct Det {
  const CocoDetection* d;
  int64_t id;   // loadRes: its index in the results + 1
  double area;  // w · h
};

// One (image, category): its boxes in the file's order, its detections by score (stable), cut
// at the largest maxDets, and their IoUs [detection][box].
struct Cell {
  std::vector<const CocoGroundTruth::Box*> gt;
  std::vector<Det> dt;
  std::vector<double> ious;
};

// evaluateImg for one area range at the largest maxDets: what accumulate reads of it.
struct ImageEval {
  std::vector<double> scores;        // [D]
  std::vector<int64_t> dt_matches;   // [T, D]: the matched box's id, 0 unmatched
  std::vector<uint8_t> dt_ignore;    // [T, D]
  int64_t gt_counted = 0;            // boxes not ignored
  int64_t D = 0;
};

ImageEval evaluate_image(const Cell& c, const double area[2]) {
  const auto& thr = iou_thresholds();
  const size_t G = c.gt.size();
  // Boxes ignored last (a stable sort of the ignore flags), each knowing its column in ious.
  std::vector<size_t> order(G);
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint8_t> ignore(G);
  for (size_t g = 0; g < G; ++g) {
    const auto* b = c.gt[g];
    ignore[g] = b->iscrowd || b->area < area[0] || b->area > area[1];
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ignore[a] < ignore[b]; });
  ImageEval e;
  e.D = static_cast<int64_t>(c.dt.size());
  const size_t D = c.dt.size();
  e.dt_matches.assign(kT * D, 0);
  e.dt_ignore.assign(kT * D, 0);
  for (const auto& d : c.dt) e.scores.push_back(d.d->score);
  for (size_t g = 0; g < G; ++g) e.gt_counted += ignore[g] == 0;
  std::vector<int64_t> gt_matched(kT * G, 0);
  for (int t = 0; t < kT && G > 0; ++t) {
    for (size_t d = 0; d < D; ++d) {
      double best = std::min(thr[t], 1 - 1e-10);
      int64_t m = -1;
      for (size_t k = 0; k < G; ++k) {
        const size_t g = order[k];
        if (gt_matched[t * G + k] > 0 && !c.gt[g]->iscrowd) continue;  // taken, and not a crowd
        if (m > -1 && ignore[order[m]] == 0 && ignore[g] == 1) break;   // a real match beats an ignored one
        const double iou = c.ious[d * G + g];
        if (iou < best) continue;
        best = iou;
        m = static_cast<int64_t>(k);
      }
      if (m == -1) continue;
      e.dt_ignore[t * D + d] = ignore[order[m]];
      e.dt_matches[t * D + d] = c.gt[order[m]]->id;
      gt_matched[t * G + m] = c.dt[d].id;
    }
  }
  // Unmatched detections outside the area range are ignored.
  for (size_t d = 0; d < D; ++d) {
    const bool outside = c.dt[d].area < area[0] || c.dt[d].area > area[1];
    for (int t = 0; t < kT; ++t) {
      if (e.dt_matches[t * D + d] == 0 && outside) e.dt_ignore[t * D + d] = 1;
    }
  }
  return e;
}

// accumulate for one (category, area, maxDets): precision [T, R] and recall [T] into `out`.
void accumulate_one(const std::vector<const ImageEval*>& evals, int max_det, double* precision, double* recall,
                    int64_t K, int64_t k, int a, int m) {
  std::vector<double> scores;
  std::vector<std::pair<size_t, size_t>> at;  // (image eval, detection) of each score
  int64_t counted = 0;
  for (size_t i = 0; i < evals.size(); ++i) {
    const int64_t n = std::min<int64_t>(evals[i]->D, max_det);
    for (int64_t d = 0; d < n; ++d) scores.push_back(evals[i]->scores[d]), at.emplace_back(i, d);
    counted += evals[i]->gt_counted;
  }
  if (counted == 0) return;
  std::vector<size_t> inds(scores.size());
  std::iota(inds.begin(), inds.end(), 0);
  std::stable_sort(inds.begin(), inds.end(), [&](size_t a, size_t b) { return -scores[a] < -scores[b]; });
  const auto& rec_thr = recall_thresholds();
  const size_t nd = inds.size();
  for (int t = 0; t < kT; ++t) {
    std::vector<double> rc(nd), pr(nd);
    double tp = 0, fp = 0;
    for (size_t j = 0; j < nd; ++j) {
      const ImageEval& e = *evals[at[inds[j]].first];
      const size_t d = at[inds[j]].second, D = static_cast<size_t>(e.D);
      const bool matched = e.dt_matches[t * D + d] != 0, ignored = e.dt_ignore[t * D + d] != 0;
      tp += matched && !ignored;
      fp += !matched && !ignored;
      rc[j] = tp / static_cast<double>(counted);
      pr[j] = tp / (fp + tp + std::numeric_limits<double>::epsilon());
    }
    recall[((t * K + k) * kA + a) * kM + m] = nd > 0 ? rc[nd - 1] : 0;
    for (size_t i = nd - 1; i > 0 && nd > 0; --i) pr[i - 1] = std::max(pr[i - 1], pr[i]);
    for (int r = 0; r < kR; ++r) {  // searchsorted(rc, thr, 'left'); past the end stays 0
      const size_t pi = static_cast<size_t>(std::lower_bound(rc.begin(), rc.end(), rec_thr[r]) - rc.begin());
      precision[(((t * kR + r) * K + k) * kA + a) * kM + m] = pi < nd ? pr[pi] : 0;
    }
  }
}

// COCOeval._summarize: the mean of the entries above -1, or -1.
double summarize(const CocoEvalResult& e, bool ap, int t_only, int a, int m) {
  const int64_t K = e.categories;
  double sum = 0;
  int64_t n = 0;
  for (int t = 0; t < kT; ++t) {
    if (t_only >= 0 && t != t_only) continue;
    for (int64_t k = 0; k < K; ++k) {
      if (ap) {
        for (int r = 0; r < kR; ++r) {
          const double v = e.precision[(((t * kR + r) * K + k) * kA + a) * kM + m];
          if (v > -1) sum += v, ++n;
        }
      } else {
        const double v = e.recall[((t * K + k) * kA + a) * kM + m];
        if (v > -1) sum += v, ++n;
      }
    }
  }
  return n == 0 ? -1 : sum / static_cast<double>(n);
}

// np.where(iouThr == p.iouThrs): the threshold's index, compared exactly as numpy compares.
int threshold_index(double iou) {
  const auto& thr = iou_thresholds();
  for (int t = 0; t < kT; ++t) {
    if (thr[t] == iou) return t;
  }
  return -2;  // none: the mean of nothing, -1
}

}  // namespace

CocoGroundTruth read_coco_ground_truth(const std::string& path) {
  const json j = parse(path);
  if (!j.is_object() || !j.contains("images") || !j.contains("annotations") || !j.contains("categories")) {
    throw bad_input("{}: a COCO instances file is an object with \"images\", \"annotations\" and \"categories\"", path);
  }
  CocoGroundTruth gt;
  for (const json& im : j.at("images")) gt.image_ids.push_back(field<int64_t>(im, "id", path + ": an image"));
  for (const json& c : j.at("categories")) gt.category_ids.push_back(field<int64_t>(c, "id", path + ": a category"));
  std::sort(gt.image_ids.begin(), gt.image_ids.end());
  gt.image_ids.erase(std::unique(gt.image_ids.begin(), gt.image_ids.end()), gt.image_ids.end());
  std::sort(gt.category_ids.begin(), gt.category_ids.end());
  gt.category_ids.erase(std::unique(gt.category_ids.begin(), gt.category_ids.end()), gt.category_ids.end());
  const json& anns = j.at("annotations");
  for (size_t i = 0; i < anns.size(); ++i) {
    const json& a = anns[i];
    const std::string where =
        fmt::format("{}: annotation {}", path, a.contains("id") ? a.at("id").dump() : "#" + std::to_string(i));
    CocoGroundTruth::Box b;
    b.id = field<int64_t>(a, "id", where);
    b.image_id = field<int64_t>(a, "image_id", where);
    b.category_id = field<int64_t>(a, "category_id", where);
    read_bbox(a, where, b.bbox);
    b.area = field<double>(a, "area", where);
    b.iscrowd = a.contains("iscrowd") && field<int64_t>(a, "iscrowd", where) != 0;
    gt.boxes.push_back(b);
  }
  return gt;
}

std::vector<CocoDetection> read_coco_results(const std::string& path, const CocoGroundTruth& gt) {
  const json j = parse(path);
  if (!j.is_array()) throw bad_input("{}: a COCO results file is a JSON list of detections", path);
  std::vector<CocoDetection> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = fmt::format("{}: detection {}", path, i);
    CocoDetection d;
    d.image_id = field<int64_t>(j[i], "image_id", where);
    d.category_id = field<int64_t>(j[i], "category_id", where);
    read_bbox(j[i], where, d.bbox);
    d.score = field<double>(j[i], "score", where);
    out.push_back(d);
  }
  return out;
}

CocoEvalResult coco_evaluate(const CocoGroundTruth& gt, const std::vector<CocoDetection>& detections) {
  const auto& cats = gt.category_ids;
  const auto& imgs = gt.image_ids;
  const int64_t K = static_cast<int64_t>(cats.size()), I = static_cast<int64_t>(imgs.size());
  std::unordered_map<int64_t, int64_t> cat_index, img_index;
  for (int64_t k = 0; k < K; ++k) cat_index[cats[k]] = k;
  for (int64_t i = 0; i < I; ++i) img_index[imgs[i]] = i;
  std::vector<Cell> cells(static_cast<size_t>(K * I));
  for (const auto& b : gt.boxes) {
    const auto k = cat_index.find(b.category_id), i = img_index.find(b.image_id);
    if (k == cat_index.end() || i == img_index.end()) continue;  // as getAnnIds: outside the evaluated sets
    cells[k->second * I + i->second].gt.push_back(&b);
  }
  for (size_t n = 0; n < detections.size(); ++n) {
    const CocoDetection& d = detections[n];
    const auto k = cat_index.find(d.category_id), i = img_index.find(d.image_id);
    if (i == img_index.end()) throw bad_input("detection {}: image {} is not in the ground truth", n, d.image_id);
    if (k == cat_index.end()) {
      throw bad_input("detection {}: category {} is not in the ground truth's categories (COCO's ids expected, not "
                      "class indices: D16)",
                      n, d.category_id);
    }
    cells[k->second * I + i->second].dt.push_back({&d, static_cast<int64_t>(n) + 1, d.bbox[2] * d.bbox[3]});
  }
  const int max_det = kMaxDets[kM - 1];
  for (Cell& c : cells) {
    std::stable_sort(c.dt.begin(), c.dt.end(), [](const Det& a, const Det& b) { return -a.d->score < -b.d->score; });
    if (static_cast<int>(c.dt.size()) > max_det) c.dt.resize(max_det);
    const size_t G = c.gt.size();
    c.ious.resize(c.dt.size() * G);
    for (size_t d = 0; d < c.dt.size(); ++d) {
      for (size_t g = 0; g < G; ++g) c.ious[d * G + g] = box_iou(c.dt[d].d->bbox, c.gt[g]->bbox, c.gt[g]->iscrowd);
    }
  }
  CocoEvalResult out;
  out.categories = K;
  out.precision.assign(static_cast<size_t>(kT * kR * K * kA * kM), -1);
  out.recall.assign(static_cast<size_t>(kT * K * kA * kM), -1);
  for (int64_t k = 0; k < K; ++k) {
    for (int a = 0; a < kA; ++a) {
      std::vector<ImageEval> evals;
      for (int64_t i = 0; i < I; ++i) {
        const Cell& c = cells[k * I + i];
        if (c.gt.empty() && c.dt.empty()) continue;  // evaluateImg's None
        evals.push_back(evaluate_image(c, kAreaRanges[a]));
      }
      std::vector<const ImageEval*> view;
      for (const auto& e : evals) view.push_back(&e);
      if (view.empty()) continue;
      for (int m = 0; m < kM; ++m) {
        accumulate_one(view, kMaxDets[m], out.precision.data(), out.recall.data(), K, k, a, m);
      }
    }
  }
  const int all = 0, small = 1, medium = 2, large = 3, m100 = 2;
  out.stats = {summarize(out, true, -1, all, m100),
               summarize(out, true, threshold_index(.5), all, m100),
               summarize(out, true, threshold_index(.75), all, m100),
               summarize(out, true, -1, small, m100),
               summarize(out, true, -1, medium, m100),
               summarize(out, true, -1, large, m100),
               summarize(out, false, -1, all, 0),
               summarize(out, false, -1, all, 1),
               summarize(out, false, -1, all, m100),
               summarize(out, false, -1, small, m100),
               summarize(out, false, -1, medium, m100),
               summarize(out, false, -1, large, m100)};
  return out;
}

std::string CocoEvalResult::summary() const {
  static const char* kLines[12] = {
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
      " Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ]",
      " Average Precision  (AP) @[ IoU=0.75      | area=   all | maxDets=100 ]",
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=  1 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets= 10 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]"};
  std::string out;
  for (int i = 0; i < 12; ++i) out += fmt::format("{} = {:0.3f}\n", kLines[i], stats[i]);
  return out;
}

const std::array<const char*, 12>& coco_stat_names() {
  static const std::array<const char*, 12> names = {"AP",    "AP50",     "AP75",      "AP_small", "AP_medium", "AP_large",
                                                    "AR1",   "AR10",     "AR100",     "AR_small", "AR_medium", "AR_large"};
  return names;
}

}  // namespace crucible::data
