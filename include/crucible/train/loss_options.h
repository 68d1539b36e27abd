// The [loss] section, torch-free (the losses are in train/loss.h). Each loss declares its own
// keys in its entry of loss_settings_registry() (loss_options.cpp), whose names are
// loss_registry()'s (the torch side; tests/train/run_state_test.cpp holds the two to the same
// names).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "crucible/core/registry.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::train {

// The training loss (a registry name, train/loss.h) and its options.
struct LossSection {
  std::string name = "cross_entropy";
  double label_smoothing = 0.1;       // cross_entropy: label smoothing
  std::vector<double> class_weights;  // cross_entropy: one weight per class ([] = equal)
};

// A loss's own keys of [loss] (a key two losses share: declared by the first).
struct LossSettings {
  std::function<void(LossSection& options, ConfigSchema& schema)> declare;
};
// Every loss by name: loss.name's allowed values.
const Registry<LossSettings>& loss_settings_registry();

// Binds [loss]: the name, then each loss's own keys.
void declare_loss_settings(LossSection& options, ConfigSchema& schema);

}  // namespace crucible::train
