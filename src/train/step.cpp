// The training step (see step.h): micro-batches, OOM split, gradient sync, unscale, clipping,
// the finiteness vote and the optimizer step; and TrialStep, the same step on a scratch model.
#include "crucible/train/step.h"

#include <chrono>
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/host_read.h"
#include "crucible/core/log.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/model.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/grad_scaler.h"
#include "crucible/train/loss.h"
#include "crucible/obs/phase_clock.h"

namespace crucible::train {

using obs::Phase;
using obs::PhaseClock;
namespace {

// CPU and CUDA allocators both report through c10::Error; std::bad_alloc from plain new.
bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

}  // namespace

c10::ScalarType autocast_dtype(const Precision& precision) {
  return precision.dtype == ComputeDtype::kFp16 ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

MicroBatchRecord accumulate_gradients(nn::Model& model, const at::Tensor& x, const at::Tensor& y,
                                      const MicroBatchOptions& options, at::Tensor& loss_sum, at::Tensor& correct) {
  MicroBatchRecord record;
  for (const auto& named : model.named_parameters()) {
    const at::Tensor& p = named.tensor;
    if (p.dim() == 4 && p.size(1) > 1) {  // a convolution weight whose two layouts differ
      record.channels_last = p.is_contiguous(at::MemoryFormat::ChannelsLast) && !p.is_contiguous();
      break;
    }
  }
  const int64_t n = x.size(0);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(options.parts, n));
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (end <= begin) continue;
    if (options.before_forward) options.before_forward(end - begin);
    const at::Tensor xs = x.narrow(0, begin, end - begin);
    const at::Tensor ys = y.narrow(0, begin, end - begin);
    at::Tensor logits, loss;
    {
      compat::AutocastGuard amp(x.device().type(), options.amp_dtype, options.autocast);
      logits = model.forward(xs);
      loss = options.loss != nullptr
                 ? options.loss->mean(logits, ys)
                 : at::cross_entropy_loss(logits, ys, {}, at::Reduction::Mean, -100, options.label_smoothing);
    }
    record.logits_dtype = logits.scalar_type();
    if (options.clock != nullptr) options.clock->lap(Phase::kForward);
    const double weight = static_cast<double>(end - begin) / static_cast<double>(n);
    if (options.before_backward) options.before_backward(p == parts - 1);
    (loss * (weight * options.loss_scale)).backward();
    at::NoGradGuard no_grad;
    loss_sum.add_(loss.detach().to(at::kDouble), static_cast<double>(end - begin));
    correct.add_(top1_hits(logits.detach(), ys).sum());
    if (options.clock != nullptr) options.clock->lap(Phase::kBackward);
  }
  return record;
}

MicroBatchRecord accumulate_detection_gradients(nn::Detector& detector, const DeviceBatch& batch,
                                                const MicroBatchOptions& options, IntervalSums& sums,
                                                std::vector<std::string>* term_names) {
  MicroBatchRecord record;
  const int64_t n = batch.images.size(0);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(options.parts, n));
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (end <= begin) continue;
    if (options.before_forward) options.before_forward(end - begin);
    // Each image at its own size inside the padded batch (host sizes: views, no read).
    std::vector<at::Tensor> images;
    std::vector<nn::BoxTargets> targets;
    for (int64_t i = begin; i < end; ++i) {
      images.push_back(batch.images[i]
                           .narrow(1, 0, batch.image_sizes[static_cast<size_t>(2 * i)])
                           .narrow(2, 0, batch.image_sizes[static_cast<size_t>(2 * i + 1)]));
      targets.push_back(batch.boxes[static_cast<size_t>(i)]);
    }
    nn::LossDict terms;
    {
      compat::AutocastGuard amp(batch.images.device().type(), options.amp_dtype, options.autocast);
      terms = detector.losses(images, targets, batch.min_size);
    }
    std::vector<at::Tensor> values;
    for (const auto& t : terms) values.push_back(t.second.to(at::kFloat));
    const at::Tensor stacked = at::stack(values);  // [terms] float
    const at::Tensor loss = stacked.sum();
    record.logits_dtype = terms.empty() ? c10::ScalarType::Undefined : terms.front().second.scalar_type();
    if (options.clock != nullptr) options.clock->lap(Phase::kForward);
    const double weight = static_cast<double>(end - begin) / static_cast<double>(n);
    if (options.before_backward) options.before_backward(p == parts - 1);
    (loss * (weight * options.loss_scale)).backward();
    at::NoGradGuard no_grad;
    const auto images_n = static_cast<double>(end - begin);
    sums.loss_sum.add_(loss.detach().to(at::kDouble), images_n);
    const at::Tensor each = stacked.detach().to(at::kDouble);
    if (!sums.loss_terms.defined()) {
      sums.loss_terms = at::zeros_like(each);
      term_names->clear();
      for (const auto& t : terms) term_names->push_back(t.first);
    }
    sums.loss_terms.add_(each, images_n);
    if (options.clock != nullptr) options.clock->lap(Phase::kBackward);
  }
  return record;
}

// A detection batch's ground truth per image, on the device: views of the packed boxes where an
// image has no crowd box (the usual case), an index otherwise. Crowd boxes are left out of
// training, as torchvision's reference (ConvertCocoPolysToMask) leaves them out; evaluation
// counts them, as COCOeval does.
std::vector<nn::BoxTargets> detection_targets(const data::Batch& host, const at::Tensor& boxes,
                                              const at::Tensor& labels) {
  std::vector<nn::BoxTargets> out;
  for (int64_t i = 0; i < host.size(); ++i) {
    const int64_t begin = host.box_offsets[static_cast<size_t>(i)], end = host.box_offsets[static_cast<size_t>(i + 1)];
    std::vector<int64_t> keep;
    for (int64_t k = begin; k < end; ++k) {
      if (host.box_crowd.empty() || host.box_crowd[static_cast<size_t>(k)] == 0) keep.push_back(k);
    }
    if (static_cast<int64_t>(keep.size()) == end - begin) {
      out.push_back({boxes.narrow(0, begin, end - begin), labels.narrow(0, begin, end - begin)});
    } else {
      const at::Tensor index = at::tensor(keep, at::kLong).to(boxes.device());
      out.push_back({boxes.index_select(0, index), labels.index_select(0, index)});
    }
  }
  return out;
}

std::vector<std::pair<std::string, double>> interval_figures(const TrainStep& step, const PackedValues& v,
                                                             double samples) {
  const std::vector<std::string>& names = step.loss_term_names();
  if (names.empty()) return {{"acc", v.value("correct") / samples}};
  // A detector: each loss term, a mean per image over the interval (torchvision's names).
  const std::vector<double> terms = v.values("loss_terms");
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < names.size(); ++k) out.emplace_back("loss_" + names[k], terms[k] / samples);
  return out;
}

IntervalSums IntervalSums::zeros(c10::Device device) {
  IntervalSums s;
  s.loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  s.correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  s.grad_norm_max = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  s.clipped_norm_max = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  return s;
}

void IntervalSums::pack(PackedValues& out) const {
  out.add("loss_sum", loss_sum);
  out.add("correct", correct);
  out.add("grad_norm_max", grad_norm_max);
  out.add("clipped_norm_max", clipped_norm_max);
  const int64_t groups = group_norms.size(0) / 2;  // the updates' norms, then the weights' (below)
  out.add("update_norm", group_norms.narrow(0, 0, groups));
  out.add("weight_norm", group_norms.narrow(0, groups, groups));
  if (loss_terms.defined()) out.add("loss_terms", loss_terms);
}

void IntervalSums::zero() {
  loss_sum.zero_();
  correct.zero_();
  grad_norm_max.zero_();
  clipped_norm_max.zero_();
  if (group_norms.defined()) group_norms.zero_();
  if (loss_terms.defined()) loss_terms.zero_();
}

TrainStep::TrainStep(nn::Model& model, const Loss& loss, Optimizer& optimizer, GradScaler& scaler,
                     std::vector<NamedTensor> params, TrainStepOptions options, c10::Device device, distributed::Comm* comm,
                     distributed::GradSync* grad_sync)
    : model_(model),
      loss_(loss),
      optimizer_(optimizer),
      scaler_(scaler),
      options_(std::move(options)),
      device_(device),
      comm_(comm),
      grad_sync_(grad_sync),
      sums_(IntervalSums::zeros(device)) {
  for (auto& p : params) {
    names_.push_back(std::move(p.name));
    params_.push_back(std::move(p.tensor));
  }
  sums_.group_norms = at::zeros({2 * static_cast<int64_t>(optimizer_.groups().size())},
                                at::TensorOptions().dtype(at::kFloat).device(device));
}

GradScalerOptions grad_scaler_options(const JobConfig& job, const Precision& precision) {
  GradScalerOptions so;
  // bf16 keeps fp32's exponent range: scaling is for fp16 (or when asked for).
  using LS = TrainSection::LossScaling;
  so.enabled = job.train.loss_scaling == LS::kOn ||
               (job.train.loss_scaling == LS::kAuto && precision.dtype == ComputeDtype::kFp16);
  so.init_scale = job.train.loss_scale;
  so.interval = job.train.loss_scale_interval;
  return so;
}

TrainStep::Sums TrainStep::save_sums() const {
  return {sums_.loss_sum.clone(), sums_.correct.clone(),
          sums_.loss_terms.defined() ? sums_.loss_terms.clone() : at::Tensor()};
}

void TrainStep::restore_sums(const Sums& saved) {
  sums_.loss_sum.copy_(saved.loss_sum);
  sums_.correct.copy_(saved.correct);
  if (saved.loss_terms.defined()) {
    sums_.loss_terms.copy_(saved.loss_terms);
  } else if (sums_.loss_terms.defined()) {
    sums_.loss_terms.zero_();  // made by this step: nothing was in it before
  }
}

TrainStep::Result TrainStep::run(const at::Tensor& x, const at::Tensor& y, int64_t step, double lr, double momentum,
                                 bool stop_requested, const std::vector<int64_t>& sample_ids) {
  DeviceBatch batch;
  batch.images = x;
  batch.targets = y;
  return run(batch, step, lr, momentum, stop_requested, sample_ids);
}

TrainStep::Result TrainStep::run(const DeviceBatch& batch, int64_t step, double lr, double momentum,
                                 bool stop_requested, const std::vector<int64_t>& sample_ids) {
  const Sums saved = save_sums();
  forward_backward(batch, step, sample_ids, saved);
  if (grad_sync_ != nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    grad_sync_->finish();  // gradients averaged over ranks (a straggler's peers wait here)
    sync_wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lap(Phase::kCommunication);  // what backward did not hide
  }
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (const auto& p : params_) grads.push_back(p.grad());
  scaler_.unscale(grads);  // T1: unscaled before clipping
  if (options_.clip_norm > 0) clip(grads);
  Result result;
  const bool finite = vote(grads, stop_requested, &result);
  lap(Phase::kHostSync);
  result.taken = scaler_.update(!finite);
  if (result.taken) {
    if (before_update) before_update(names_, grads);
    const int64_t every = options_.update_norm_every;
    std::vector<at::Tensor> before;
    if (every > 0 && (step + 1) % every == 0) {
      at::NoGradGuard no_grad;
      for (const auto& g : optimizer_.groups()) {
        for (const auto& p : g.params) before.push_back(p.tensor.detach().clone());
      }
    }
    optimizer_.step(lr, momentum);
    if (!before.empty()) measure_update(before);
    counters_.bad_in_row = 0;
  } else {
    skip(step, grads, saved);
  }
  optimizer_.zero_grad();  // T10: set to none
  lap(Phase::kOptimizer);
  return result;
}

// T4: ‖after − before‖ and ‖after‖ per group, on the device (read with the interval's sums).
void TrainStep::measure_update(const std::vector<at::Tensor>& before) {
  at::NoGradGuard no_grad;
  const auto& groups = optimizer_.groups();
  std::vector<at::Tensor> updates, weights;
  size_t k = 0;
  for (const auto& g : groups) {
    std::vector<at::Tensor> u, w;
    for (const auto& p : g.params) {
      const at::Tensor now = p.tensor.detach().to(at::kFloat);
      u.push_back((now - before[k++].to(at::kFloat)).norm());
      w.push_back(now.norm());
    }
    const auto zero = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
    updates.push_back(u.empty() ? zero : at::stack(u).norm());
    weights.push_back(w.empty() ? zero : at::stack(w).norm());
  }
  updates.insert(updates.end(), weights.begin(), weights.end());
  sums_.group_norms.copy_(at::stack(updates));
}

void TrainStep::lap(Phase phase) {
  if (clock_ != nullptr) clock_->lap(phase);
}

// M5: `accumulate` micro-batches per step; T16: on an allocation failure, the same batch again
// as twice as many micro-batches (the interval's sums restored to `saved`), until one sample
// alone does not fit.
void TrainStep::forward_backward(const DeviceBatch& batch, int64_t step, const std::vector<int64_t>& sample_ids,
                                 const Sums& saved) {
  nn::Detector* detector = batch.detection() ? dynamic_cast<nn::Detector*>(&model_) : nullptr;
  if (batch.detection() && detector == nullptr) {
    throw bad_input("a detection batch reached a model that is not a detector");
  }
  const int64_t n = batch.images.size(0);
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(options_.accumulate, n));
  for (;;) {
    try {
      MicroBatchOptions o;
      o.parts = parts;
      o.loss = &loss_;
      o.autocast = options_.precision.mixed();
      o.amp_dtype = autocast_dtype(options_.precision);
      o.loss_scale = scaler_.enabled() ? scaler_.scale() : 1.0;
      if (before_forward) o.before_forward = [this, step](int64_t samples) { before_forward(step, samples); };
      o.clock = clock_;
      if (grad_sync_ != nullptr) {
        o.before_backward = [this](bool last) { grad_sync_->communicate(last); };  // M5: only the last
      }
      ran_ = detector != nullptr
                 ? accumulate_detection_gradients(*detector, batch, o, sums_, &term_names_)
                 : accumulate_gradients(model_, batch.images, batch.targets, o, sums_.loss_sum, sums_.correct);
      return;
    } catch (const std::exception& e) {
      if (!options_.split_on_oom || !is_out_of_memory(e)) throw;
      if (comm_ != nullptr) {
        // Retrying would change this rank's collectives (buckets may be in flight): stop.
        throw runtime_error("step {}: out of memory on rank {} under data parallel, where a batch cannot be "
                            "retried in pieces; lower train.batch_size or raise train.accumulate: {}",
                            step, comm_->rank(), e.what());
      }
      optimizer_.zero_grad();
      restore_sums(saved);
      compat::release_cached_memory(device_);
      if (parts >= n) {
        throw runtime_error("step {}: out of memory with a single sample (sample ids {}{}): {}", step,
                            fmt::join(sample_ids.begin(), sample_ids.begin() + std::min<size_t>(8, sample_ids.size()),
                                      ", "),
                            sample_ids.size() > 8 ? ", …" : "", e.what());
      }
      const int64_t before = parts;
      parts = std::min<int64_t>(parts * 2, n);
      ++counters_.oom_retries;
      log_warn("step {}: out of memory with micro-batches of {} samples; retrying the batch as {} micro-batches of "
               "about {} (T16)",
               step, (n + before - 1) / before, parts, (n + parts - 1) / parts);
    }
  }
}

// Clips the global gradient norm to clip_norm, keeping the interval's largest norms before and
// after. No host read: the factor is clamped on the device, as torch.nn.utils.clip_grad_norm_ does.
void TrainStep::clip(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (const auto& g : grads) {
    if (g.defined()) total.add_(g.detach().to(at::kFloat).pow(2).sum());
  }
  const at::Tensor norm = total.sqrt();
  const at::Tensor factor = (options_.clip_norm / (norm + 1e-6)).clamp_max(1.0);
  at::Tensor clipped = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    const_cast<at::Tensor&>(g).mul_(factor);
    clipped.add_(g.detach().to(at::kFloat).pow(2).sum());
  }
  sums_.grad_norm_max.copy_(at::maximum(sums_.grad_norm_max, norm));
  sums_.clipped_norm_max.copy_(at::maximum(sums_.clipped_norm_max, clipped.sqrt()));
}

// The one host read of the step: are loss and gradients finite (needed to skip the step). Under
// data parallel the ranks decide together: [any rank non-finite, any rank asked to stop], one
// small all-reduce and still one host read per step.
bool TrainStep::vote(const std::vector<at::Tensor>& grads, bool stop_requested, Result* result) {
  std::vector<at::Tensor> checked = grads;
  checked.push_back(sums_.loss_sum);
  if (comm_ == nullptr) {
    lap(Phase::kOptimizer);  // unscale, clipping
    result->stop_agreed = stop_requested;
    return all_finite(checked);  // its reductions and the read
  }
  at::NoGradGuard no_grad;
  at::Tensor flags = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(device_));
  at::Tensor ok = at::ones({}, at::TensorOptions().dtype(at::kBool).device(device_));
  for (const auto& t : checked) {
    if (t.defined()) ok = at::logical_and(ok, at::isfinite(t).all());
  }
  flags[0] = at::logical_not(ok).to(at::kFloat);
  flags[1] = stop_requested ? 1.0 : 0.0;
  lap(Phase::kOptimizer);  // unscale, clipping, the finiteness reductions
  comm_->all_reduce_sum(flags);
  lap(Phase::kCommunication);
  const std::vector<double> host = host_values(flags, HostRead::kStepVote);
  result->stop_agreed = host[1] > 0.0;
  return host[0] == 0.0;
}

// A non-finite step: skipped and counted, naming the first non-finite tensor; max_bad_steps in
// a row end the run (exit 3). The interval's metrics must not carry the non-finite values.
void TrainStep::skip(int64_t step, const std::vector<at::Tensor>& grads, const Sums& saved) {
  ++counters_.skipped_steps;
  ++counters_.bad_in_row;
  std::vector<std::string> names = {"loss"};
  std::vector<at::Tensor> tensors = {sums_.loss_sum};
  names.insert(names.end(), names_.begin(), names_.end());
  tensors.insert(tensors.end(), grads.begin(), grads.end());
  const std::string bad = first_non_finite(names, tensors);
  const std::string what = bad == "loss" ? "the loss" : "the gradient of " + bad;
  if (counters_.bad_in_row >= options_.max_bad_steps) {
    optimizer_.zero_grad();
    throw diverged("training diverged: {} is not finite at step {} ({} bad steps in a row, train.max_bad_steps = "
                   "{}); the last good checkpoint in {} is intact",
                   what, step, counters_.bad_in_row, options_.max_bad_steps, options_.checkpoint_dir);
  }
  log_warn("step {}: {} is not finite; step skipped{} ({} of {} allowed in a row)", step, what,
           scaler_.enabled() ? fmt::format(", loss scale now {}", scaler_.scale()) : "", counters_.bad_in_row,
           options_.max_bad_steps);
  restore_sums(saved);
}

data::NormalizeOptions normalize_options(const JobConfig& job) {
  if (job.data.dataset == DataSection::Dataset::kDetection) {
    // A detector takes 0–1 RGB and normalises inside (GeneralizedRCNNTransform's image_mean/std).
    return {{0.0, 0.0, 0.0}, {1.0, 1.0, 1.0}, data::ValueRange::kUnit, data::ColorOrder::kRGB};
  }
  return {job.data.mean, job.data.std, data::parse_value_range(job.data.mean_std_range, "data.mean_std_range"),
          data::parse_color_order(job.data.mean_std_order, "data.mean_std_order")};
}

std::vector<ParamGroup> parameter_groups(const OptimOptions& options, const std::vector<NamedTensor>& params) {
  ParamGroup decay, no_decay;
  decay.name = "weights";
  no_decay.name = "bias_and_norm";
  decay.weight_decay = options.weight_decay;
  no_decay.weight_decay = options.decay_bias_and_norm ? options.weight_decay : 0.0;
  for (const auto& p : params) (p.tensor.dim() <= 1 ? no_decay : decay).params.push_back(p);
  return {decay, no_decay};
}

struct TrialStep::Parts {
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<Optimizer> optimizer;
  GradScaler scaler;
  std::unique_ptr<TrainStep> step;
  double lr = 0, momentum = 0;
};

TrialStep::TrialStep(const JobConfig& job, int64_t in_channels, int64_t height, int64_t width, int64_t classes,
                     const Precision& precision, c10::Device device)
    : p_(std::make_unique<Parts>()) {
  p_->model = nn::make_model(job.model, in_channels, height, width, classes);
  p_->model->to(device);
  if (precision.channels_last) nn::to_channels_last(*p_->model);
  p_->model->train(true);
  p_->loss = make_loss({job.loss, classes, device});
  std::vector<NamedTensor> params = p_->model->named_parameters();
  p_->optimizer = make_optimizer(job.optim, parameter_groups(job.optim, params));
  p_->scaler = GradScaler(grad_scaler_options(job, precision));
  TrainStepOptions o;
  o.precision = precision;
  o.accumulate = job.train.accumulate;
  o.clip_norm = job.train.clip_norm;
  o.max_bad_steps = job.train.max_bad_steps;
  o.split_on_oom = false;
  o.checkpoint_dir = "(none: a trial step)";
  p_->step = std::make_unique<TrainStep>(*p_->model, *p_->loss, *p_->optimizer, p_->scaler, std::move(params), o,
                                         device);
  p_->lr = job.optim.lr;
  p_->momentum = optimizer_momentum(job.optim);
}

TrialStep::~TrialStep() = default;

void TrialStep::run(const at::Tensor& x, const at::Tensor& y) {
  // The finiteness read at the end of the step waits for the device.
  p_->step->run(x, y, /*step=*/0, p_->lr, p_->momentum, /*stop_requested=*/false);
}

}  // namespace crucible::train
