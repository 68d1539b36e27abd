// The weight sets a checkpoint can hold, by name: the values of eval's and predict's --weights.
// "model" is the model's own; a step observer that keeps weights of its own beside the model
// declares its set in its own file (the weight EMA, ema.cpp: "ema"), and the registry
// (recipe.cpp) lists each in one line. No other file spells a set's checkpoint keys.
// Built once, then read-only.
#pragma once

#include <string>

#include "crucible/core/registry.h"

namespace crucible::train {

struct WeightSet {
  std::string prefix;  // its tensors' checkpoint keys: prefix + the model's parameter and buffer names
  std::string marker;  // a metadata key every checkpoint holding the set has (empty: every checkpoint does)
  std::string what;    // how messages name it ("weight EMA")
  std::string absent;  // why a checkpoint lacks it ("its run trained with train.ema = false")
  std::string source;  // what holds it ("a run trained with train.ema = true")
};

// The model's own weights, "model." in every checkpoint.
const WeightSet& model_weight_set();
// Every set, "model" first; the entry's help is --weights' description of it.
const Registry<WeightSet>& weight_set_registry();

}  // namespace crucible::train
