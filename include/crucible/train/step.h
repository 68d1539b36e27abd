// The training step, in one copy, used by the Trainer, `precision = auto` and `tune batch`:
// - accumulate_gradients: forward + backward of one batch as `parts` micro-batches (M5), each
//   micro-batch's mean loss weighted by its share of the batch, so the summed gradients equal
//   those of the whole batch's mean loss for any split whenever the model treats samples
//   independently (BatchNorm in training mode does not: it normalises each micro-batch by its
//   own statistics, as it would in any framework);
// - TrainStep: that, retried as smaller micro-batches on an allocation failure (T16), then
//   gradient sync, unscale (T1), clipping, the finiteness vote (skip or exit 3) and the
//   optimizer step, with the interval's metrics kept on the device (law 2);
// - TrialStep: a throwaway copy of a job's step on one batch, for timing and sizing.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "crucible/data/loader/device_input.h"
#include "crucible/train/job_config.h"
#include "crucible/train/optimizer.h"  // NamedTensor
#include "crucible/train/precision.h"

namespace crucible::nn {
class Model;
class Detector;
struct BoxTargets;
}
namespace crucible::distributed {
class Comm;
class GradSync;
}  // namespace crucible::distributed

namespace crucible::obs {
class PhaseClock;
enum class Phase;
}

namespace crucible {
class PackedValues;
}

namespace crucible::train {

class GradScaler;
struct GradScalerOptions;
class Loss;
struct DeviceBatch;
struct IntervalSums;

// The job's loss scaling (T1) for this precision: on for fp16 under "auto", or as configured.
GradScalerOptions grad_scaler_options(const JobConfig& job, const Precision& precision);

// autocast's dtype for a mixed precision (bf16 for fp32, which does not autocast).
c10::ScalarType autocast_dtype(const Precision& precision);

struct MicroBatchOptions {
  int64_t parts = 1;                                  // micro-batches (clamped to the batch size)
  const Loss* loss = nullptr;                         // null: cross-entropy with label_smoothing
  double label_smoothing = 0.0;                       // (only without `loss`)
  bool autocast = false;                              // mixed precision forward
  c10::ScalarType amp_dtype = c10::ScalarType::BFloat16;
  double loss_scale = 1.0;                            // GradScaler's factor (T1), 1 when off
  // Called with each micro-batch's size before its forward (a test seam raises here).
  std::function<void(int64_t samples)> before_forward;
  // Called before each backward; `last` on the final micro-batch (gradient sync arms there).
  std::function<void(bool last)> before_backward;
  obs::PhaseClock* clock = nullptr;  // laps forward and backward when set
};

// What the step ran in, for the record (summary.json): the logits' dtype and whether the
// model's convolution weights were channels_last (the weights, not the input: with one input
// channel both layouts have the same strides).
struct MicroBatchRecord {
  c10::ScalarType logits_dtype = c10::ScalarType::Undefined;
  bool channels_last = false;
};

// Forward + backward of `x` [B, C, H, W] / `y` [B] in `options.parts` micro-batches, gradients
// accumulated into the parameters' .grad. Adds Σ loss × samples to `loss_sum` (double, device)
// and the number of correct argmaxes to `correct` (long, device): no host read.
MicroBatchRecord accumulate_gradients(nn::Model& model, const at::Tensor& x, const at::Tensor& y,
                                      const MicroBatchOptions& options, at::Tensor& loss_sum, at::Tensor& correct);

// A detector's forward + backward of `batch` (DeviceBatch::detection) in `options.parts`
// micro-batches (options.loss and label_smoothing unused): the loss is the sum of the detector's
// loss dict, each micro-batch's weighted by its share of the batch. Adds Σ loss × images to
// sums.loss_sum and Σ term × images to sums.loss_terms (made on the first call, one per term,
// their names into `term_names`): no host read. torchvision normalises its terms by the
// foreground count of the batch it sees, so micro-batches give their own normalisation, as
// BatchNorm's statistics do above.
MicroBatchRecord accumulate_detection_gradients(nn::Detector& detector, const DeviceBatch& batch,
                                                const MicroBatchOptions& options, IntervalSums& sums,
                                                std::vector<std::string>* term_names);

// A detection batch's ground truth per image, on the device (`boxes` [total, 4] and `labels`
// [total], packed as `host` packs them: DeviceInput::boxes): views where an image has no crowd
// box, an index otherwise. Crowd regions are left out of training, as torchvision's reference
// (ConvertCocoPolysToMask) leaves them out; evaluation counts them, as COCOeval does.
std::vector<nn::BoxTargets> detection_targets(const data::Batch& host, const at::Tensor& boxes,
                                              const at::Tensor& labels);

// The metrics of the current log interval, on the device (law 2), read once per interval.
struct IntervalSums {
  at::Tensor loss_sum;          // Σ loss × samples (double)
  at::Tensor correct;           // correct top-1 (long)
  at::Tensor loss_terms;        // detectors: Σ term × images per loss term (double); undefined otherwise
  at::Tensor grad_norm_max;     // with clipping: the largest global gradient norm before clipping
  at::Tensor clipped_norm_max;  // … and after it (float)
  // T4, [2 × groups] float: at the step TrainStepOptions::update_norm_every names, the L2 norm
  // of the update the optimizer applied to each parameter group (weight decay included: a
  // zero gradient still moves decayed weights), then each group's weight norm after it.
  at::Tensor group_norms;
  static IntervalSums zeros(c10::Device device);
  void zero();
  // Into `out` by name, for the interval's one read: loss_sum, correct, grad_norm_max,
  // clipped_norm_max, then update_norm and weight_norm (one value per parameter group), then
  // loss_terms when defined.
  void pack(PackedValues& out) const;
};

// Counters a checkpoint keeps.
struct StepCounters {
  int64_t skipped_steps = 0;  // non-finite steps skipped over the whole run
  int64_t bad_in_row = 0;     // non-finite steps in a row
  int64_t oom_retries = 0;    // batches re-run as smaller micro-batches (T16)
};

struct TrainStepOptions {
  Precision precision;         // autocast when mixed
  int64_t accumulate = 1;      // micro-batches per step (M5)
  double clip_norm = 0;        // 0 = off
  int64_t max_bad_steps = 3;   // non-finite steps in a row before exit 3
  bool split_on_oom = true;    // T16; false: an allocation failure propagates (tune batch)
  std::string checkpoint_dir;  // named when training diverges ("the last good checkpoint in …")
  // T4: every this many steps (the log interval's last step: step + 1 a multiple), the
  // update's norm per parameter group into IntervalSums::group_norms (the weights copied once
  // before the update). 0: never.
  int64_t update_norm_every = 0;
};

class TrainStep;
// The interval's task figures from its read sums (`samples` over the interval, this rank's): a
// classifier's "acc", or a detector's "loss_<term>" per loss term, each a mean per image.
std::vector<std::pair<std::string, double>> interval_figures(const TrainStep& step, const PackedValues& v,
                                                             double samples);

class TrainStep {
 public:
  // `params` (names parallel to the tensors) are the parameters the optimizer updates, in the
  // model's order. `comm`/`grad_sync` are null in a single process. All must outlive the step.
  TrainStep(nn::Model& model, const Loss& loss, Optimizer& optimizer, GradScaler& scaler,
            std::vector<NamedTensor> params, TrainStepOptions options, c10::Device device,
            distributed::Comm* comm = nullptr, distributed::GradSync* grad_sync = nullptr);

  struct Result {
    bool taken = false;        // the optimizer stepped (false: non-finite, skipped)
    bool stop_agreed = false;  // some rank asked to stop (data parallel; else `stop_requested`)
  };
  // One optimizer step on (x, y) at this step's lr and momentum. `step` names it in messages;
  // `stop_requested` is this rank's wish to stop, voted with finiteness under data parallel (one
  // host read per step either way). Throws diverged after max_bad_steps bad steps in a row.
  // `sample_ids` name the batch's samples in an out-of-memory message.
  Result run(const at::Tensor& x, const at::Tensor& y, int64_t step, double lr, double momentum,
             bool stop_requested, const std::vector<int64_t>& sample_ids = {});
  // The same on a whole device batch: a detection batch (DeviceBatch::detection) trains the
  // model, which must then be an nn::Detector, on its loss dict.
  Result run(const DeviceBatch& batch, int64_t step, double lr, double momentum, bool stop_requested,
             const std::vector<int64_t>& sample_ids = {});
  // A detector's loss terms in IntervalSums::loss_terms' order (empty before its first step).
  const std::vector<std::string>& loss_term_names() const { return term_names_; }

  IntervalSums& sums() { return sums_; }
  // Seconds this rank waited for the gradient sync to finish since the last call (host time:
  // with Gloo the wait for the last rank to arrive; with NCCL only the launch).
  double take_sync_wait() { return std::exchange(sync_wait_, 0.0); }
  StepCounters& counters() { return counters_; }
  const MicroBatchRecord& ran() const { return ran_; }
  // The step-time breakdown's clock (the Trainer's): forward, backward, communication,
  // optimizer and host-sync laps. Null: not timed.
  void set_clock(obs::PhaseClock* clock) { clock_ = clock; }
  // Test seam (T16): called with the step and each micro-batch's size before its forward.
  std::function<void(int64_t step, int64_t samples)> before_forward;
  // When set: called with the gradients the optimizer is about to apply (averaged over ranks,
  // unscaled, clipped; names parallel), on the steps it takes. The trainer sets it on the steps
  // whose histograms it writes (log.histogram_every).
  std::function<void(const std::vector<std::string>& names, const std::vector<at::Tensor>& grads)> before_update;

 private:
  struct Sums {  // the interval's sums before this step (restored when it is retried or skipped)
    at::Tensor loss_sum, correct, loss_terms;
  };
  Sums save_sums() const;
  void restore_sums(const Sums& saved);
  void forward_backward(const DeviceBatch& batch, int64_t step, const std::vector<int64_t>& sample_ids,
                        const Sums& saved);
  void clip(const std::vector<at::Tensor>& grads);
  bool vote(const std::vector<at::Tensor>& grads, bool stop_requested, Result* result);
  void skip(int64_t step, const std::vector<at::Tensor>& grads, const Sums& saved);
  void measure_update(const std::vector<at::Tensor>& before);
  void lap(obs::Phase phase);

  nn::Model& model_;
  const Loss& loss_;
  Optimizer& optimizer_;
  GradScaler& scaler_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  TrainStepOptions options_;
  c10::Device device_;
  distributed::Comm* comm_;
  distributed::GradSync* grad_sync_;
  IntervalSums sums_;
  StepCounters counters_;
  MicroBatchRecord ran_;
  std::vector<std::string> term_names_;
  obs::PhaseClock* clock_ = nullptr;
  double sync_wait_ = 0;
};

// T4 parameter groups: weight decay on weights, none on biases and normalisation weights (1-D
// tensors) unless options.decay_bias_and_norm.
std::vector<ParamGroup> parameter_groups(const OptimOptions& options, const std::vector<NamedTensor>& params);

// The job's input normalisation (data.mean/std in their stated range and channel order, D3/D4),
// as the trainer's DeviceInput and every trial of the step take it.
data::NormalizeOptions normalize_options(const JobConfig& job);

// A throwaway copy of a job's training step — a fresh model (from torch's generator as it is),
// its optimizer, loss, loss scaler and TrainStep — in one precision, for `precision = auto`
// (timing) and `tune batch` (what fits): both measure the step that trains.
class TrialStep {
 public:
  TrialStep(const JobConfig& job, int64_t in_channels, int64_t height, int64_t width, int64_t classes,
            const Precision& precision, c10::Device device);
  ~TrialStep();
  // One whole step (an allocation failure propagates); returns after the device finished.
  void run(const at::Tensor& x, const at::Tensor& y);

 private:
  struct Parts;
  std::unique_ptr<Parts> p_;
};

}  // namespace crucible::train
