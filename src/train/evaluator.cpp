// Evaluator (see evaluator.h).
#include "crucible/train/evaluator.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "crucible/core/compat.h"
#include "crucible/core/log.h"
#include "crucible/core/error.h"
#include "crucible/data/eval/coco_eval.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/nn/model.h"
#include "crucible/train/detection_eval.h"
#include "crucible/train/gather.h"
#include "crucible/train/loss.h"
#include "crucible/train/step.h"

namespace crucible::train {

Evaluator::Evaluator(nn::Model& model, data::Loader& loader, const data::DeviceInput& input, const Loss& loss,
                     const Precision& precision, c10::Device device, distributed::Comm* comm)
    : model_(model),
      loader_(loader),
      input_(input),
      loss_(loss),
      precision_(precision),
      device_(device),
      comm_(comm) {}

void log_eval(int64_t step, const EvalResult& r, int ranks, double seconds) {
  if (r.detection()) {
    log_info("eval after step {}: AP {:.4f} (AP50 {:.4f}, AP75 {:.4f}; AR@100 {:.4f}) ({} images{}, {:.1f} s)", step,
             r.coco[0], r.coco[1], r.coco[2], r.coco[8], r.samples,
             ranks > 0 ? fmt::format(" over {} ranks", ranks) : std::string(), seconds);
    return;
  }
  log_info("eval after step {}: test accuracy {:.2f}% (top-5 {:.2f}%), loss {:.4f} ({} samples{}, {:.1f} s)", step,
           100 * r.acc, 100 * r.top5, r.loss, r.samples, ranks > 0 ? fmt::format(" over {} ranks", ranks) : std::string(),
           seconds);
}

std::vector<std::pair<std::string, double>> eval_figures(const EvalResult& r) {
  if (!r.detection()) return {{"test_loss", r.loss}, {"test_acc", r.acc}, {"test_top5", r.top5}};
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < r.coco.size(); ++k) out.emplace_back(std::string("test_") + data::coco_stat_names()[k], r.coco[k]);
  return out;
}

EvalResult Evaluator::run() { return run(model_); }

void Evaluator::set_ground_truth(std::shared_ptr<const data::CocoGroundTruth> truth) { truth_ = std::move(truth); }

const std::vector<data::CocoDetection>& Evaluator::last_detections() const {
  static const std::vector<data::CocoDetection> none;
  return detections_ ? *detections_ : none;
}

void Evaluator::forward_each(nn::Model& model, const BatchFn& fn) {
  nn::EvalGuard guard(model);  // M1: eval mode + no grad, restored after
  compat::AutocastGuard amp(device_.type(), autocast_dtype(precision_), precision_.mixed());
  loader_.start_epoch(0);
  while (auto batch = loader_.next()) {
    const at::Tensor x = input_.images(*batch);
    const at::Tensor y = input_.labels(*batch);
    fn(*batch, y, model.forward(x));
  }
}

EvalResult Evaluator::run(nn::Model& model) {
  if (truth_) {
    auto* detector = dynamic_cast<nn::Detector*>(&model);
    if (detector == nullptr) throw bad_input("detection evaluation: the model is not a detector");
    // Under the precision's autocast, as training's forward ran (M1: eval mode inside).
    compat::AutocastGuard amp(device_.type(), autocast_dtype(precision_), precision_.mixed());
    DetectionEval d = evaluate_detections(*detector, loader_, *truth_, device_, comm_);
    EvalResult result;
    result.loss = result.acc = result.top5 = -1;
    result.samples = d.images;
    result.coco.assign(d.coco.stats.begin(), d.coco.stats.end());
    detections_ = std::make_shared<std::vector<data::CocoDetection>>(std::move(d.results));
    return result;
  }
  std::vector<at::Tensor> ids, losses, hits, hits5;
  forward_each(model, [&](const data::Batch& batch, const at::Tensor& y, const at::Tensor& logits) {
    losses.push_back(loss_.per_sample(logits, y).to(at::kDouble));
    hits.push_back(top1_hits(logits, y).to(at::kDouble));
    // Top-k as PyTorch's reference scripts count it (ties at the k-th place: topk's choice).
    hits5.push_back(topk_hits(logits, y, std::min<int64_t>(5, logits.size(1))).to(at::kDouble));
    ids.push_back(at::tensor(batch.sample_ids, at::kLong).to(device_).to(at::kDouble));
  });
  const auto dev = at::TensorOptions().dtype(at::kDouble).device(device_);
  constexpr int64_t kCols = 4;  // sample id, loss, top-1 hit, top-5 hit
  const at::Tensor local = ids.empty() ? at::zeros({0, kCols}, dev)
                                       : at::stack({at::cat(ids), at::cat(losses), at::cat(hits), at::cat(hits5)}, 1);
  const SampleRows rows = gather_sample_rows(local, comm_);
  double loss_total = 0, correct_total = 0, top5_total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double* row = rows[i];
    loss_total += row[1];
    correct_total += row[2];
    top5_total += row[3];
  }
  const auto n = static_cast<int64_t>(rows.size());
  EvalResult result;
  result.loss = loss_total / static_cast<double>(std::max<int64_t>(1, n));
  result.acc = correct_total / static_cast<double>(std::max<int64_t>(1, n));
  result.top5 = top5_total / static_cast<double>(std::max<int64_t>(1, n));
  result.samples = n;
  return result;
}

}  // namespace crucible::train
