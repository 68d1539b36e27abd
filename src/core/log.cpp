// Rank-aware line logging with a redrawable status line (see log.h).
#include "crucible/core/log.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <mutex>

#include "crucible/core/file.h"

namespace crucible {
namespace {

struct LogState {
  std::mutex mu;
  int rank = 0;
  bool all_ranks = false;
  int file = -1;          // the log file (train.log), appended whole lines at a time
  std::string file_path;
  std::string status;  // the live status line, "" when none
};

LogState& state() {
  static LogState s;
  return s;
}

bool speaks(const LogState& s) { return s.all_ranks || s.rank == 0; }

// The status line cut to the terminal's width: a wrapped line cannot be redrawn with "\r".
std::string fit_terminal(const std::string& line) {
  struct winsize ws {};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return line;
  const size_t cols = ws.ws_col - 1u;
  return line.size() > cols ? line.substr(0, cols) : line;
}

}  // namespace

void set_log_rank(int rank, bool all_ranks) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rank = rank;
  s.all_ranks = all_ranks;
}

int log_rank() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.rank;
}

void set_log_file(const std::string& path) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.file >= 0) {
    ::close(s.file);
    s.file = -1;
  }
  s.file_path = path;
  if (!path.empty()) s.file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

void log_line(LogLevel level, const std::string& line) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // Errors are printed by every rank: a failing rank must be able to say why (law 6).
  if (!speaks(s) && level != LogLevel::kError) return;
  const char* prefix = level == LogLevel::kWarn ? "warning: " : level == LogLevel::kError ? "error: " : "";
  std::string rank_tag = s.all_ranks || s.rank != 0 ? fmt::format("[rank {}] ", s.rank) : std::string();
  if (!s.status.empty()) std::fputs("\r\033[K", stdout);
  std::FILE* out = level == LogLevel::kInfo ? stdout : stderr;
  if (out == stderr) std::fflush(stdout);
  std::fprintf(out, "%s%s%s\n", rank_tag.c_str(), prefix, line.c_str());
  std::fflush(out);
  if (!s.status.empty()) {
    std::fputs(s.status.c_str(), stdout);
    std::fflush(stdout);
  }
  if (s.file >= 0) {
    // Whole lines or none (law 5): on a full disk the line is cut back, the file keeps what it
    // had, and it is not written again (the terminal still gets every line).
    try {
      append_whole(s.file, s.file_path, fmt::format("{}{}{}\n", rank_tag, prefix, line));
    } catch (const std::exception& e) {
      ::close(s.file);
      s.file = -1;
      std::fprintf(stderr, "%swarning: %s is no longer written: %s\n", rank_tag.c_str(), s.file_path.c_str(),
                   e.what());
      std::fflush(stderr);
    }
  }
}

void set_status_line(const std::string& line) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!speaks(s)) return;
  s.status = fit_terminal(line);
  std::fputs("\r\033[K", stdout);
  std::fputs(s.status.c_str(), stdout);
  std::fflush(stdout);
}

void clear_status_line() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.status.empty()) return;
  s.status.clear();
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace crucible
