// evaluate_detections: detect image by image, gather the rows of every rank (gather.h), keep
// each sample's first evaluation, evaluate once.
#include "crucible/train/detection_eval.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "crucible/core/error.h"
#include "crucible/data/loader/loader.h"
#include "crucible/distributed/comm.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/train/gather.h"

namespace crucible::train {
// Image `j` of a detection batch as the detector takes it: [3, h, w] float in 0–1 on `device`.
at::Tensor detection_image(const data::Batch& b, int64_t j, c10::Device device) {
  const int64_t c = b.spec.channels, h = b.spec.height, w = b.spec.width;
  const auto all = at::from_blob(b.pixels.data(), b.channels_first ? std::vector<int64_t>{b.size(), c, h, w}
                                                                   : std::vector<int64_t>{b.size(), h, w, c},
                                 at::kByte);
  at::Tensor img = b.channels_first ? all[j] : all[j].permute({2, 0, 1});
  img = img.narrow(1, 0, b.image_sizes[2 * j]).narrow(2, 0, b.image_sizes[2 * j + 1]);
  return img.to(device).to(at::kFloat).div_(255.0);
}

namespace {

// Columns of a row: a key unique over every rank (rank · 2^32 + the rank's row), the rank, the
// sample id, the row's place among its sample's rows, then a detection — image id, category id
// (-1: the sample's marker row, which every evaluated sample has, detections or not), x, y, w, h,
// score.
enum Col { kKey, kRank, kSample, kPlace, kImage, kCategory, kX, kY, kW, kH, kScore, kCols };

// COCOeval over the images evaluated (its imgIds): all of the file's, unless data.test_samples
// kept some of them or the bad-sample policy skipped one.
data::CocoGroundTruth images_of(const data::CocoGroundTruth& truth, const std::set<int64_t>& evaluated) {
  data::CocoGroundTruth some;
  some.category_ids = truth.category_ids;
  for (const int64_t id : truth.image_ids) {
    if (evaluated.count(id) != 0) some.image_ids.push_back(id);
  }
  for (const auto& b : truth.boxes) {
    if (evaluated.count(b.image_id) != 0) some.boxes.push_back(b);
  }
  return some;
}

}  // namespace

DetectionEval evaluate_detections(nn::Detector& detector, data::Loader& loader, const data::CocoGroundTruth& truth,
                                  c10::Device device, distributed::Comm* comm) {
  const std::vector<int64_t> categories = loader.pipeline().category_ids();
  const int rank = comm != nullptr ? comm->rank() : 0;
  std::vector<double> rows;
  int64_t row_count = 0;
  const auto add = [&](int64_t sample, int64_t place, int64_t image, int64_t category, const double* box, double score) {
    const double row[kCols] = {static_cast<double>(rank) * 4294967296.0 + static_cast<double>(row_count++),
                               static_cast<double>(rank), static_cast<double>(sample), static_cast<double>(place),
                               static_cast<double>(image), static_cast<double>(category), box[0], box[1], box[2],
                               box[3], score};
    rows.insert(rows.end(), row, row + kCols);
  };
  {
    nn::EvalGuard eval(detector);
    at::NoGradGuard no_grad;
    loader.start_epoch(0);
    while (auto batch = loader.next()) {
      if (!batch->detection) throw bad_input("detection evaluation: the test data are not a detection set");
      for (int64_t j = 0; j < batch->size(); ++j) {
        const int64_t sample = batch->sample_ids[static_cast<size_t>(j)];
        const int64_t image = batch->image_ids[static_cast<size_t>(j)];
        const double none[4] = {0, 0, 0, 0};
        add(sample, -1, image, -1, none, 0);
        // Outside the step: evaluation reads its detections on the host.
        const nn::Detections d = detector.detect({detection_image(*batch, j, device)})[0];
        const at::Tensor boxes = d.boxes.to(at::kCPU, at::kDouble).contiguous();
        const at::Tensor scores = d.scores.to(at::kCPU, at::kDouble).contiguous();
        const at::Tensor labels = d.labels.to(at::kCPU, at::kLong).contiguous();
        for (int64_t k = 0; k < scores.size(0); ++k) {
          const double* xyxy = boxes.data_ptr<double>() + 4 * k;
          const double xywh[4] = {xyxy[0], xyxy[1], xyxy[2] - xyxy[0], xyxy[3] - xyxy[1]};
          const int64_t label = labels.data_ptr<int64_t>()[k];
          if (!categories.empty() && (label < 0 || label >= static_cast<int64_t>(categories.size()))) {
            throw bad_input("detection evaluation: the detector gave label {}, but the data have {} categories "
                            "(model.num_classes must be the data's)", label, categories.size());
          }
          const int64_t category = categories.empty() ? label : categories[static_cast<size_t>(label)];
          add(sample, k, image, category, xywh, scores.data_ptr<double>()[k]);
        }
      }
    }
  }
  const at::Tensor local =
      at::from_blob(rows.data(), {row_count, kCols}, at::kDouble).clone().to(comm != nullptr ? device : c10::kCPU);
  const SampleRows all = gather_sample_rows(local, comm);
  // Each sample's first evaluation (in rank order): the sampler's padding evaluates some twice.
  std::map<int64_t, int> first_rank;
  std::set<int64_t> evaluated;  // image ids
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i][kCategory] >= 0) continue;
    first_rank.emplace(static_cast<int64_t>(all[i][kSample]), static_cast<int>(all[i][kRank]));
    evaluated.insert(static_cast<int64_t>(all[i][kImage]));
  }
  std::vector<std::tuple<int64_t, int64_t, const double*>> kept;  // (sample, place, row)
  for (size_t i = 0; i < all.size(); ++i) {
    const double* r = all[i];
    const auto sample = static_cast<int64_t>(r[kSample]);
    if (r[kCategory] >= 0 && first_rank.at(sample) == static_cast<int>(r[kRank])) {
      kept.emplace_back(sample, static_cast<int64_t>(r[kPlace]), r);
    }
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  });
  DetectionEval out;
  out.images = static_cast<int64_t>(first_rank.size());
  for (const auto& k : kept) {
    const double* r = std::get<2>(k);
    data::CocoDetection d;
    d.image_id = static_cast<int64_t>(r[kImage]);
    d.category_id = static_cast<int64_t>(r[kCategory]);
    std::copy(r + kX, r + kX + 4, d.bbox);
    d.score = r[kScore];
    out.results.push_back(d);
  }
  out.coco = evaluated.size() == truth.image_ids.size() ? data::coco_evaluate(truth, out.results)
                                                        : data::coco_evaluate(images_of(truth, evaluated), out.results);
  return out;
}

}  // namespace crucible::train
