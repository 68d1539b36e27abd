// PhaseClock: measures a training step's phases (breakdown.h) as contiguous laps — each lap()
// gives the time since the previous one to a phase, so the phases add up to the step. On CPU
// the laps are host clock readings; on CUDA they are events on the compute stream, read back
// only when take() is called after the interval's own host read, so timing adds no sync per
// phase. Disabled (train.profile = "off"), every call returns at once. Not thread-safe.
#pragma once

#include <memory>

#include <c10/core/Device.h>

#include "crucible/obs/breakdown.h"

namespace crucible::obs {

class PhaseClock {
 public:
  PhaseClock(c10::Device device, bool enabled);
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  bool enabled() const { return enabled_; }
  // A step begins: the next lap counts from here (time between steps belongs to none).
  void start();
  // The time since the previous lap (or start) belongs to `phase`.
  void lap(Phase phase);
  // Time from here to the next start() belongs to no phase (evaluation, a checkpoint).
  void pause();
  // The phases' seconds since the previous take() (CUDA: waits for the last lap's event).
  PhaseSeconds take();

 private:
  struct Impl;
  bool enabled_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crucible::obs
