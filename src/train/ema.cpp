// Weight EMA (see ema.h): WeightEma, and the step observer that keeps one for a run
// (train.ema): updated after the optimizer step on torchvision's iterations, evaluated after
// every evaluation of the model, in every checkpoint, its digest in summary.json, and written
// to the run folder as the model is.
#include "crucible/train/ema.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/nn/model.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/job.h"
#include "crucible/train/recipe.h"
#include "crucible/train/run_state.h"
#include "crucible/train/session.h"
#include "crucible/train/weight_set.h"

namespace crucible::train {

const WeightSet& ema_weight_set();  // below

double ema_decay(const EmaOptions& e, const TrainSection& t, int world_size) {
  if (!e.adjust) return e.decay;
  // train.py: adjust = args.world_size * args.batch_size * args.model_ema_steps / args.epochs
  // (an integer product, then Python's true division), alpha = min(1.0, (1 - decay) * adjust).
  const int64_t samples = global_batch(t, world_size) * e.steps;
  const double adjust = static_cast<double>(samples) / static_cast<double>(t.epochs);
  const double alpha = std::min(1.0, (1.0 - e.decay) * adjust);
  return 1.0 - alpha;
}

WeightEma::WeightEma(const std::vector<nn::NamedTensor>& tensors, double decay) : decay_(decay) {
  if (!(decay >= 0.0 && decay <= 1.0)) throw bad_input("weight EMA: decay {} is not in [0, 1]", decay);
  at::NoGradGuard no_grad;
  for (const auto& t : tensors) avg_.push_back({t.name, t.tensor.detach().clone()});  // deepcopy: same layout
}

void WeightEma::update(const std::vector<nn::NamedTensor>& model) {
  if (model.size() != avg_.size()) {
    throw runtime_error("weight EMA: the model lists {} parameters and buffers, the average {}", model.size(),
                        avg_.size());
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < avg_.size(); ++i) {
    at::Tensor& avg = avg_[i].tensor;
    const at::Tensor m = model[i].tensor.detach();
    if (model[i].name != avg_[i].name || m.sizes() != avg.sizes() || m.scalar_type() != avg.scalar_type()) {
      throw runtime_error("weight EMA: tensor {} of the model is {} {} [{}], the average's is {} {} [{}]", i,
                          model[i].name, c10::toString(m.scalar_type()), fmt::join(m.sizes(), ", "), avg_[i].name,
                          c10::toString(avg.scalar_type()), fmt::join(avg.sizes(), ", "));
    }
    if (n_averaged_ == 0) {
      avg.copy_(m);
    } else {
      // ExponentialMovingAverage's avg_fn, term for term: decay * avg + (1 - decay) * model,
      // each product rounded in the tensor's type (float32 for an integer buffer) before the sum,
      // then copied back (truncated for an integer buffer), as AveragedModel's copy_ does.
      avg.copy_(avg * decay_ + m * (1.0 - decay_));
    }
  }
  ++n_averaged_;
}

namespace {

std::vector<nn::NamedTensor> model_tensors(nn::Model& model) {
  std::vector<nn::NamedTensor> all = model.named_parameters();
  for (auto& b : model.named_buffers()) all.push_back(std::move(b));
  return all;
}

// `other`'s values in `model` while it lives (evaluation, export), the model's own restored bit
// for bit after: the contents are exchanged through one temporary tensor at a time, so `other`
// holds the model's values meanwhile and nothing else is kept.
class Exchanged {
 public:
  Exchanged(nn::Model& model, std::vector<nn::NamedTensor>& other) : live_(model_tensors(model)), other_(other) {
    exchange();
  }
  ~Exchanged() {
    try {
      exchange();
    } catch (const std::exception& e) {
      log_error("weight EMA: the model's own weights could not be put back after evaluating the average: {}",
                e.what());
    }
  }
  Exchanged(const Exchanged&) = delete;
  Exchanged& operator=(const Exchanged&) = delete;

 private:
  void exchange() {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < live_.size(); ++i) {
      const at::Tensor tmp = live_[i].tensor.detach().clone();
      live_[i].tensor.detach().copy_(other_[i].tensor);
      other_[i].tensor.copy_(tmp);
    }
  }
  std::vector<nn::NamedTensor> live_;
  std::vector<nn::NamedTensor>& other_;
};

class EmaObserver final : public StepObserver {
 public:
  EmaObserver(nn::Model& model, double decay, int64_t every, int64_t warmup_epochs, distributed::Comm* comm,
              std::string bn_policy)
      : ema_(model_tensors(model), decay),
        params_(model.named_parameters().size()),
        every_(every),
        warmup_epochs_(warmup_epochs),
        comm_(comm),
        bn_policy_(std::move(bn_policy)) {}

  void after_update(const StepEvent& e) override {
    // train.py: `if model_ema and i % args.model_ema_steps == 0: model_ema.update_parameters(model)`
    // after optimizer.step(), i the data loader's iteration in the epoch (0-based). A loader batch
    // is one optimizer step here also with train.accumulate (the step splits the batch into
    // micro-batches), so i counts the epoch's optimizer steps and an update sees batch_size ×
    // ema_steps samples, which is what ema_adjust assumes; the EMA never averages weights that
    // an accumulation left half-updated.
    const int64_t i = e.batch_in_epoch - 1;
    if (i % every_ != 0) return;
    ema_.update(model_tensors(e.model));
    // train.py: `if epoch < args.lr_warmup_epochs: model_ema.n_averaged.fill_(0)`: during the
    // warm-up every update copies the weights.
    if (e.epoch < warmup_epochs_) ema_.reset_count();
  }

  // The parameters are equal on every rank (the same averaged gradients); the BatchNorm buffers
  // are each rank's own until dist.bn makes them equal (M2), so the average's are made equal at
  // the same moments as the model's: before a checkpoint and before they are evaluated.
  void before_checkpoint() override { sync_buffers(); }

  void checkpoint_fields(CheckpointIO& io) override {
    for (auto& t : ema_.tensors()) io.tensor(ema_weight_set().prefix + t.name, t.tensor);
    int64_t n = ema_.n_averaged();
    io.value(ema_weight_set().marker, n);
    if (io.reading()) ema_.set_n_averaged(n);
    io.note("ema.decay", fmt::format("{:.17g}", ema_.decay()));
    io.value("ema.last_eval_step", last_eval_step_);
    io.value("ema.last_test_acc", last_.acc);
    io.value("ema.last_test_top5", last_.top5);
    io.value("ema.last_test_loss", last_.loss);
  }

  EvalFigures after_evaluation(int64_t step, const EvalResult& model_result, Evaluator& evaluator) override {
    const auto t0 = std::chrono::steady_clock::now();
    sync_buffers();
    {
      Exchanged in(evaluator.model(), ema_.tensors());
      last_ = evaluator.run(evaluator.model());
    }
    last_eval_step_ = step;
    log_info("eval after step {}, EMA weights: test accuracy {:.2f}% (top-5 {:.2f}%), loss {:.4f} (the model: "
             "{:.2f}%; {:.1f} s)",
             step, 100 * last_.acc, 100 * last_.top5, last_.loss, 100 * model_result.acc,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return figures();
  }

  void summary_fields(nlohmann::json& summary) override {
    summary["ema_sha256"] = tensors_sha256(ema_.tensors());
    summary["ema_decay"] = ema_.decay();
    for (const auto& [name, value] : figures()) summary[name] = value;  // also for a rerun of a finished run
  }

  void after_training(nn::Model& model, const std::string& run_dir) override {
    Exchanged in(model, ema_.tensors());
    export_model(model, run_dir, "model_ema");
  }

  std::string describe() const override {
    return fmt::format("weight EMA (decay {:.8g}, every {} steps{})", ema_.decay(), every_,
                       warmup_epochs_ > 0 ? fmt::format(", copying the weights during {} warm-up epochs", warmup_epochs_)
                                          : std::string());
  }

 private:
  EvalFigures figures() const {
    if (last_eval_step_ < 0) return {};
    return {{"test_loss_ema", last_.loss}, {"test_acc_ema", last_.acc}, {"test_top5_ema", last_.top5}};
  }

  void sync_buffers() {
    if (comm_ == nullptr || bn_policy_.empty()) return;
    const auto& all = ema_.tensors();
    distributed::sync_buffers(*comm_, std::vector<nn::NamedTensor>(all.begin() + static_cast<ptrdiff_t>(params_), all.end()),
                              bn_policy_);
  }

  WeightEma ema_;
  size_t params_;  // ema_.tensors(): the parameters, then the buffers
  int64_t every_;
  int64_t warmup_epochs_;
  distributed::Comm* comm_;  // null in a single process
  std::string bn_policy_;    // dist.bn's buffer policy; empty: nothing to make equal (one process, or sync)
  EvalResult last_;
  int64_t last_eval_step_ = -1;
};

}  // namespace

// The average as a weight set of the checkpoint (eval's and predict's --weights ema).
const WeightSet& ema_weight_set() {
  static const WeightSet set{"ema.", "ema.n_averaged", "weight EMA", "its run trained with train.ema = false",
                             "a run trained with train.ema = true"};
  return set;
}

std::unique_ptr<StepObserver> make_ema_observer(const Job& job) {
  const TrainSection& t = job.config.train;
  const auto e = job.config.pieces.get<EmaOptions>(kEmaPiece);
  if (!e.enabled) return nullptr;
  if (e.steps < 1) throw bad_input("train.ema_steps: expected an integer ≥ 1, found {}", e.steps);
  if (!(e.decay >= 0.0 && e.decay <= 1.0)) {
    throw bad_input("train.ema_decay: expected a decay in [0, 1], found {}", e.decay);
  }
  const double decay = ema_decay(e, t, job.world.size);
  if (e.adjust) {
    log_info("weight EMA: decay {:.8g} = 1 − min(1, (1 − train.ema_decay {}) × {} ranks × batch {} × every {} steps / "
             "{} epochs) (train.ema_adjust, as torchvision's train.py)",
             decay, e.decay, job.world.size, t.batch_size, e.steps, t.epochs);
  }
  if (decay == 0.0) log_warn("weight EMA: decay 0: the average is a copy of the weights at each update");
  const bool sync = job.comm && job.config.dist.bn != DistSection::Bn::kSync;
  return std::make_unique<EmaObserver>(*job.model, decay, e.steps, job.config.schedule.warmup_epochs,
                                       job.comm.get(), sync ? bn_name(job.config.dist.bn) : "");
}

}  // namespace crucible::train
