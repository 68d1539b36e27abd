// The registries of the device side of a recipe (see recipe.h). One line per entry; the order of
// batch_transform_registry() is the order a batch goes through them.
#include "crucible/train/recipe.h"

#include "crucible/train/ema_options.h"
#include "crucible/train/job.h"
#include "crucible/train/mixup.h"
#include "crucible/train/multi_scale.h"
#include "crucible/train/weight_set.h"

namespace crucible::train {

// Each entry's factory, defined in the entry's own file.
std::unique_ptr<BatchTransform> make_random_erasing(const Job& job);     // mixup.cpp
std::unique_ptr<BatchTransform> make_mixup_cutmix(const Job& job);       // mixup.cpp
std::unique_ptr<BatchTransform> make_multi_scale(const Job& job);        // multi_scale.cpp
std::unique_ptr<StepObserver> make_histogram_observer(const Job& job);  // histogram_observer.cpp
std::unique_ptr<StepObserver> make_ema_observer(const Job& job);        // ema.cpp
std::unique_ptr<StepObserver> make_launch_progress(const Job& job);     // launch_progress.cpp
std::unique_ptr<StepObserver> make_test_seams(const Job& job);          // test_seams.cpp
const WeightSet& ema_weight_set();                                      // ema.cpp

const Registry<BatchTransformFactory>& batch_transform_registry() {
  static const Registry<BatchTransformFactory> registry = [] {
    Registry<BatchTransformFactory> r("batch transform");
    r.add(kRandomErasingPiece, "data.random_erase: torchvision's RandomErasing per sample, from (seed, epoch, sample)",
          make_random_erasing);
    r.add(kMixUpCutMixPiece, "data.mixup_alpha, data.cutmix_alpha: MixUp or CutMix per batch, from (seed, step, rank)",
          make_mixup_cutmix);
    r.add(kMultiScalePiece, "train.multi_scale: each step at one size drawn from (seed, step), the same on every rank (M4)",
          make_multi_scale);
    return r;
  }();
  return registry;
}

const Registry<StepObserverFactory>& step_observer_registry() {
  static const Registry<StepObserverFactory> registry = [] {
    Registry<StepObserverFactory> r("step observer");
    r.add("histograms", "log.histogram_every: TensorBoard histograms of the weights and gradients",
          make_histogram_observer);
    r.add(kEmaPiece, "train.ema: an exponential moving average of the weights, torchvision's --model-ema, evaluated "
                 "beside the model",
          make_ema_observer);
    r.add("launch_progress", "crucible launch's progress file: the step each rank is at", make_launch_progress);
    r.add("test_seams", "the test seams that act on every step (a slow rank, the step trace)", make_test_seams);
    return r;
  }();
  return registry;
}

const WeightSet& model_weight_set() {
  static const WeightSet set{"model.", "", "model", "", "every checkpoint"};
  return set;
}

const Registry<WeightSet>& weight_set_registry() {
  static const Registry<WeightSet> registry = [] {
    Registry<WeightSet> r("weight set");
    r.add("model", "the checkpoint's model", model_weight_set());
    r.add("ema", "its weight EMA, of a run with train.ema = true", ema_weight_set());
    return r;
  }();
  return registry;
}

BatchTransforms make_batch_transforms(const Job& job) {
  BatchTransforms out;
  for (const auto& e : batch_transform_registry().entries()) {
    if (auto t = e.factory(job)) out.push_back(std::move(t));
  }
  return out;
}

namespace {
StepObserverFactory& extra_step_observer() {
  static StepObserverFactory factory;
  return factory;
}
}  // namespace

void testing::set_extra_step_observer(StepObserverFactory factory) { extra_step_observer() = std::move(factory); }

StepObservers make_step_observers(const Job& job) {
  StepObservers out;
  for (const auto& e : step_observer_registry().entries()) {
    if (auto o = e.factory(job)) out.push_back(std::move(o));
  }
  if (extra_step_observer()) {
    if (auto o = extra_step_observer()(job)) out.push_back(std::move(o));
  }
  return out;
}

void apply_batch_transforms(const BatchTransforms& transforms, DeviceBatch& batch) {
  for (const auto& t : transforms) t->apply(batch);
}

}  // namespace crucible::train
