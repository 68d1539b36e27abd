// PhaseClock (see phase_clock.h): host clock laps on CPU, timeline marks (CUDA events) on GPUs.
#include "crucible/obs/phase_clock.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "crucible/core/compat.h"

namespace crucible::obs {

struct PhaseClock::Impl {
  using Clock = std::chrono::steady_clock;
  c10::Device device;
  bool timeline = false;  // device marks (CUDA) rather than host clocks
  // Host clocks.
  Clock::time_point last;
  PhaseSeconds seconds;
  // Timeline: the mark each lap ends at, with its phase (none: a pause's time, dropped);
  // `from` is where the first began.
  std::unique_ptr<compat::TimelineMark> from;
  std::vector<std::pair<std::optional<Phase>, std::unique_ptr<compat::TimelineMark>>> laps;
  bool paused = true;
  explicit Impl(c10::Device d) : device(d), timeline(d.is_cuda()) {}
};

PhaseClock::PhaseClock(c10::Device device, bool enabled)
    : enabled_(enabled), impl_(enabled ? std::make_unique<Impl>(device) : nullptr) {}

PhaseClock::~PhaseClock() = default;

void PhaseClock::start() {
  if (!enabled_) return;
  Impl& m = *impl_;
  if (!m.timeline) {
    m.last = Impl::Clock::now();
    return;
  }
  // The device timeline between steps (the host fetching a batch) is the next lap's, so that
  // a device left idle while the loader blocks shows as data wait; only a start after a pause
  // marks (the pause's time is dropped).
  if (!m.paused) return;
  m.paused = false;
  if (!m.from && m.laps.empty()) {
    m.from = compat::record_timeline_mark(m.device);
  } else {
    m.laps.emplace_back(std::nullopt, compat::record_timeline_mark(m.device));
  }
}

void PhaseClock::pause() {
  if (enabled_) impl_->paused = true;
}

void PhaseClock::lap(Phase phase) {
  if (!enabled_) return;
  Impl& m = *impl_;
  if (!m.timeline) {
    const auto now = Impl::Clock::now();
    m.seconds[phase] += std::chrono::duration<double>(now - m.last).count();
    m.last = now;
    return;
  }
  m.laps.emplace_back(phase, compat::record_timeline_mark(m.device));
}

PhaseSeconds PhaseClock::take() {
  PhaseSeconds out;
  if (!enabled_) return out;
  Impl& m = *impl_;
  if (!m.timeline) {
    std::swap(out, m.seconds);
    return out;
  }
  compat::TimelineMark* prev = m.from.get();
  for (auto& [phase, mark] : m.laps) {
    if (prev != nullptr && phase) out[*phase] += compat::timeline_seconds(*prev, *mark);
    prev = mark.get();
  }
  if (!m.laps.empty()) {
    m.from = std::move(m.laps.back().second);  // the next interval continues from here
    m.laps.clear();
  }
  return out;
}

}  // namespace crucible::obs
