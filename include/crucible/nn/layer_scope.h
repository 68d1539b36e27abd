// Marks a layer of a zoo model's forward for train.profile = "full" (train/layer_profile.h):
// `layer("layer:conv1", [&] { return bn1(conv1(x)); })` runs the lambda inside a RecordFunction
// user scope of that name (a literal: no allocation); the profiler reports it as "conv1". With no profiler armed, the scope costs a check of a
// thread-local flag. Scopes do not nest: mark a model's top-level children.
#pragma once

#include <utility>

#include <ATen/record_function.h>

namespace crucible::nn {

inline constexpr const char* kLayerScopePrefix = "layer:";

template <typename F>
auto layer(const char* scope_name, F&& f) {
  RECORD_USER_SCOPE(scope_name);
  return std::forward<F>(f)();
}

}  // namespace crucible::nn
