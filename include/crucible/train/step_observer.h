// Step observers: told after every optimizer update, with the model as updated; one may also ask
// for the gradients the update applies (on the steps it chooses), keep state in every checkpoint
// and add figures to every evaluation (of weights of its own too), fields to summary.json and
// files to the run folder at the end. The loop owns no observer's logic: TensorBoard histograms
// are the first one, the weight EMA (ema.h) the second. The observers a job runs are built from the registry in
// train/recipe.cpp. Called on every rank (only rank 0 has sinks); not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace crucible::nn {
class Model;
}
namespace crucible::obs {
class MetricSinks;
}

namespace crucible::train {

class CheckpointIO;
class Evaluator;
struct DeviceBatch;
struct EvalResult;

// Figures an observer adds to an evaluation ("test_acc_ema", 0.93): written with the eval
// record to every sink and into summary.json.
using EvalFigures = std::vector<std::pair<std::string, double>>;

struct StepEvent {
  int64_t step = 0;   // optimizer steps taken so far (the update just made is step `step`)
  int64_t epoch = 0;  // 0-based epoch of that step
  nn::Model& model;
  obs::MetricSinks& sinks;  // empty on ranks other than 0 (law 4)
  // Batches of `epoch` trained, this step's included: its batch is the epoch's loader iteration
  // batch_in_epoch - 1 (0-based; with train.accumulate one loader batch is still one step).
  int64_t batch_in_epoch = 0;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before every step, with its batch on the device after the batch transforms (`batch.step`:
  // the steps taken before it). Timed as the batch's transfer.
  virtual void before_step(const DeviceBatch& batch) {}
  // Whether the update of step `step` (1-based: the step about to be taken is step + 1) should
  // hand this observer its gradients (gradients() is then called before the update).
  virtual bool wants_gradients(int64_t next_step) const { return false; }
  // The gradients the optimizer is about to apply (averaged over ranks, unscaled, clipped;
  // names parallel to grads; undefined tensors for parameters without a gradient).
  virtual void gradients(const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) {}
  // After every optimizer update (skipped non-finite steps included: the step counter moved).
  virtual void after_update(const StepEvent& event) = 0;
  // On every rank before a checkpoint is written (rank 0 writes it; after the model's own
  // BatchNorm statistics are made equal, M2): make the state the checkpoint will hold equal on
  // every rank. Every rank calls it at the same step, so collectives are allowed.
  virtual void before_checkpoint() {}
  // The observer's state, listed once for writing and reading (as Trainer::checkpoint_fields).
  virtual void checkpoint_fields(CheckpointIO& io) {}
  // After each evaluation of the model (`result`): figures of the observer's own to add; it may
  // run `evaluator` on a model of its own (Evaluator::run(model), the same test set).
  virtual EvalFigures after_evaluation(int64_t step, const EvalResult& result, Evaluator& evaluator) { return {}; }
  // Fields of the observer's own for summary.json (e.g. a digest of weights it keeps), added
  // after the run's; on every rank (rank 0 writes the file), also when a finished run is rerun.
  virtual void summary_fields(nlohmann::json& summary) {}
  // Once at the end of training, on rank 0, after the model is written to the run folder
  // `run_dir`: what the observer keeps beside it (e.g. averaged weights, written as the model's).
  virtual void after_training(nn::Model& model, const std::string& run_dir) {}
  // For the log's "recipe:" line; empty for an observer that is not part of the recipe (the
  // launcher's progress file, the test seams).
  virtual std::string describe() const = 0;
};

using StepObservers = std::vector<std::unique_ptr<StepObserver>>;

}  // namespace crucible::train
