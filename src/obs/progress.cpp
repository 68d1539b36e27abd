// Progress: terminal bar via the log status line, or plain lines.
#include "crucible/obs/progress.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"

namespace crucible::obs {

ProgressMode parse_progress_mode(const std::string& text, bool is_terminal) {
  if (text == "auto") return is_terminal ? ProgressMode::kBar : ProgressMode::kLines;
  if (text == "bar") return ProgressMode::kBar;
  if (text == "lines") return ProgressMode::kLines;
  if (text == "none") return ProgressMode::kNone;
  throw bad_input("log.progress: expected \"auto\", \"bar\", \"lines\" or \"none\", found \"{}\"", text);
}

Progress::Progress(ProgressMode mode, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps)
    : mode_(mode), epochs_(epochs), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { clear(); }

std::string Progress::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

namespace {

// "  acc 91.20%", or nothing for a detector's readings (no accuracy).
std::string accuracy_text(const TrainReading& r) {
  return r.has_accuracy ? fmt::format("  acc {:.2f}%", 100 * r.accuracy) : std::string();
}

}  // namespace

void Progress::step_done(int64_t step, int64_t epoch) {
  if (start_step_ < 0) {
    start_step_ = step - 1;
    start_ = std::chrono::steady_clock::now();
  }
  if (mode_ != ProgressMode::kBar) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && step != total_steps_) return;
  last_draw_ = now;
  draw(step, epoch);
}

void Progress::reading(const TrainReading& r, int64_t epoch) {
  last_ = r;
  have_reading_ = true;
  if (mode_ == ProgressMode::kLines) {
    const int64_t in_epoch = r.step - epoch * steps_per_epoch_;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = start_step_ >= 0 && r.step > start_step_ ? elapsed / static_cast<double>(r.step - start_step_) : 0;
    log_info("epoch {}/{} step {}/{} ({}/{} in epoch)  loss {:.4f}{}  lr {:.3g}  {:.0f} samples/s{}  ETA {}",
             epoch + 1, epochs_, r.step, total_steps_, in_epoch, steps_per_epoch_, r.loss, accuracy_text(r), r.lr,
             r.samples_per_s, r.verdict.empty() ? "" : "  " + r.verdict,
             format_duration(rate * static_cast<double>(total_steps_ - r.step)));
  } else if (mode_ == ProgressMode::kBar) {
    draw(r.step, epoch);
  }
}

void Progress::draw(int64_t step, int64_t epoch) {
  const int64_t in_epoch = std::min(steps_per_epoch_, step - epoch * steps_per_epoch_);
  constexpr int kWidth = 24;
  const int filled = steps_per_epoch_ > 0 ? static_cast<int>(kWidth * in_epoch / steps_per_epoch_) : 0;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - start_step_;
  const double per_step = done > 0 ? elapsed / static_cast<double>(done) : 0;
  std::string metrics = have_reading_ ? fmt::format("loss {:.4f}{}  {:.0f} samples/s{}", last_.loss,
                                                    accuracy_text(last_), last_.samples_per_s,
                                                    last_.verdict.empty() ? "" : "  " + last_.verdict)
                                      : std::string("loss -  acc -");
  set_status_line(fmt::format("epoch {}/{} [{}] {}/{}  {}  ETA {}", epoch + 1, epochs_, bar, in_epoch, steps_per_epoch_,
                              metrics, done > 0 ? format_duration(per_step * static_cast<double>(total_steps_ - step)) : "?"));
}

void Progress::clear() {
  if (mode_ == ProgressMode::kBar) clear_status_line();
}

}  // namespace crucible::obs
