// LayerProfiler: train.profile = "full" — each layer's forward and backward seconds in the
// training step, from torch's RecordFunction callbacks (the hooks torch's autograd profiler is
// built on). The zoo's models mark their layers (nn/layer_scope.h); a backward node belongs to
// the layer whose forward created it (matched by the autograd sequence number, as torch's
// profiler links forward and backward). Backward nodes no layer created (the loss's, gradient
// accumulation) are counted under kOutsideLayers.
//
// Costs what a profiler costs: a callback on every operator while armed, and on CUDA a device
// synchronisation at each layer's and each backward node's start and end (so that the times are
// the device's). It is on demand; the default "light" profile uses none of this. One profiler at
// a time in a process. Thread-safe: backward may run on the autograd engine's device threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace crucible::obs {

struct LayerTime {
  std::string name;  // the layer's module name ("conv1", "layer3"), or kOutsideLayers
  double forward_seconds = 0;
  double backward_seconds = 0;
  int64_t forward_calls = 0;
};

inline constexpr const char* kOutsideLayers = "(outside layers)";

class LayerProfiler {
 public:
  // On a CUDA `device` each timed region is bracketed by device synchronisations.
  explicit LayerProfiler(c10::Device device);
  ~LayerProfiler();
  LayerProfiler(const LayerProfiler&) = delete;
  LayerProfiler& operator=(const LayerProfiler&) = delete;

  // Times only between arm() and disarm() (one training step: evaluation is left out).
  void arm();
  void disarm();
  // The layers in the order their forward first ran, then kOutsideLayers (backward only);
  // totals since construction.
  std::vector<LayerTime> layers() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crucible::obs
