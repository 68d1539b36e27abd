// Logging for a program whose rank 0 speaks (law 4).
// Lines go to stdout (info) or stderr (warnings, errors) and, when set, to a log file.
// A live status line (the progress bar on a terminal) is kept at the bottom: a log line
// clears it, prints, and redraws it. Thread-safe: every function may be called from any thread.
#pragma once

#include <string>

#include <fmt/format.h>

namespace crucible {

enum class LogLevel { kInfo, kWarn, kError };

// Only this process's rank 0 prints, unless `all_ranks` is true. Default: rank 0.
void set_log_rank(int rank, bool all_ranks = false);
int log_rank();

// Copies every printed line (without the status line) to `path`, appending. Empty path stops.
void set_log_file(const std::string& path);

// Prints one line at `level` (no trailing newline needed).
void log_line(LogLevel level, const std::string& line);

// The status line is redrawn with "\r" after each log line; only used on a terminal.
void set_status_line(const std::string& line);
void clear_status_line();

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

// True when stdout is a terminal (so a redrawn progress bar makes sense).
bool stdout_is_terminal();

}  // namespace crucible
