// The device side of a recipe, as registries: the batch transforms a training batch goes
// through between DeviceInput and the step (batch_transform.h), in registration order, and the
// step observers the loop tells after every update (step_observer.h). Adding one is a file with
// the transform or observer and one line in recipe.cpp. (The data side — sample transforms and
// samplers — is data/data_recipe.h: torch-free.) A piece with settings declares them in a
// torch-free header of its own and in declare_train_piece_settings (job_config.cpp; DESIGN.md
// "Adding a piece"). Built once, then read-only.
#pragma once

#include <functional>
#include <memory>

#include "crucible/core/registry.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/step_observer.h"

namespace crucible::train {

struct Job;

// A batch transform or step observer for an assembled job (data, model, precision and step
// built), or null when the job does not turn it on. Throws bad_input for a setting it cannot
// honour.
using BatchTransformFactory = std::function<std::unique_ptr<BatchTransform>(const Job& job)>;
using StepObserverFactory = std::function<std::unique_ptr<StepObserver>(const Job& job)>;
const Registry<BatchTransformFactory>& batch_transform_registry();
const Registry<StepObserverFactory>& step_observer_registry();

// Every registered entry the job turns on, in registration order.
BatchTransforms make_batch_transforms(const Job& job);
StepObservers make_step_observers(const Job& job);

namespace testing {
// Test seam: every job assembled from now on also gets this step observer, after the registered
// ones (a test's observer exercises the seam's whole contract); an empty factory removes it.
void set_extra_step_observer(StepObserverFactory factory);
}  // namespace testing

}  // namespace crucible::train
