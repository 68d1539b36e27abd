// Evaluator: the model on a whole test set, with exact figures under data parallel (X2/X5):
// per-sample results (sample id, loss, top-1 hit, top-5 hit) stay on the device, are gathered
// from every rank, the sampler's padding is dropped (first occurrence of each id kept), and the metrics
// are computed once over the whole set in id order, as a single process would. Runs in eval
// mode without gradients (M1), restoring the mode after. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "crucible/train/precision.h"

namespace crucible::nn {
class Model;
}
namespace crucible::data {
class Loader;
class DeviceInput;
struct Batch;
struct CocoGroundTruth;
struct CocoDetection;
}  // namespace crucible::data
namespace crucible::distributed {
class Comm;
}

namespace crucible::train {

class Loss;

struct EvalResult {
  double loss = 0;      // mean per-sample loss (no label smoothing)
  double acc = 0;       // top-1, 0–1 (argmax: the first of tied maxima); multi-label: the top
                        // class is present (precision at 1)
  double top5 = 0;      // top-k, k = min(5, classes), 0–1: the label among torch.topk's k indices
                        // (multi-label: a present class among them)
  int64_t samples = 0;  // distinct samples evaluated (over all ranks); detection: images
  // Detection: COCOeval's 12 numbers (0–1; -1 where there was nothing to measure) in
  // data::coco_stat_names() order; loss, acc and top5 are -1 then. Empty for classification.
  std::vector<double> coco;
  bool detection() const { return !coco.empty(); }
};

// "eval after step 120: test accuracy 91.2% (top-5 99.8%), loss 0.2931 (10000 samples over 3
// ranks, 1.2 s)", logged by the Trainer after each evaluation and by `crucible eval`; `ranks`
// 0 in a single process.
void log_eval(int64_t step, const EvalResult& r, int ranks, double seconds);

// The figures an evaluation record carries: test_loss, test_acc, test_top5; or a detector's
// COCO numbers, test_AP, test_AP50, … (data::coco_stat_names).
std::vector<std::pair<std::string, double>> eval_figures(const EvalResult& r);

class Evaluator {
 public:
  // Everything must outlive the evaluator; `comm` is null in a single process.
  Evaluator(nn::Model& model, data::Loader& loader, const data::DeviceInput& input, const Loss& loss,
            const Precision& precision, c10::Device device, distributed::Comm* comm = nullptr);
  EvalResult run();
  // Another model of the same job (a step observer's: e.g. averaged weights) on the same data.
  EvalResult run(nn::Model& model);
  // Detection: the test set's ground truth, which makes run() a COCO evaluation of a detector
  // across ranks (detection_eval.h); its detections kept in last_detections().
  void set_ground_truth(std::shared_ptr<const data::CocoGroundTruth> truth);
  const std::vector<data::CocoDetection>& last_detections() const;

  // One pass over the test loader (epoch 0) with `model` in eval mode, without gradients, under
  // the precision's autocast (M1), the mode restored after: `fn` gets each batch, its targets
  // on the device and the logits. What run() and predict's Predictor compute from.
  using BatchFn = std::function<void(const data::Batch& batch, const at::Tensor& targets, const at::Tensor& logits)>;
  void forward_each(nn::Model& model, const BatchFn& fn);

  nn::Model& model() { return model_; }
  const data::Loader& loader() const { return loader_; }
  const Loss& loss() const { return loss_; }
  c10::Device device() const { return device_; }
  distributed::Comm* comm() const { return comm_; }

 private:
  nn::Model& model_;
  data::Loader& loader_;
  const data::DeviceInput& input_;
  const Loss& loss_;
  Precision precision_;
  c10::Device device_;
  distributed::Comm* comm_;
  std::shared_ptr<const data::CocoGroundTruth> truth_;
  std::shared_ptr<std::vector<data::CocoDetection>> detections_;
};

}  // namespace crucible::train
