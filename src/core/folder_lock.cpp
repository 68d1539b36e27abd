// FolderLock (see folder_lock.h): flock(2) on <folder>/run.lock plus a JSON record of the holder.
#include "crucible/core/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/log.h"

namespace crucible {
namespace {

using json = nlohmann::json;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string read_small(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// /proc/<pid>/stat's starttime (field 22): "pid (comm) state ppid … starttime …"; comm may hold
// spaces and ')'.
bool read_start_ticks(int64_t pid, uint64_t* start) {
  const std::string stat = read_small(fmt::format("/proc/{}/stat", pid));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  // Fields after comm start at 3 (state); starttime is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return false;
    if (i == 22) *start = std::stoull(field);
  }
  return true;
}

}  // namespace

ProcessId process_id(int64_t pid) {
  ProcessId p;
  p.pid = pid;
  p.host = host_name();
  read_start_ticks(pid, &p.start_ticks);
  p.name = read_small(fmt::format("/proc/{}/comm", pid));
  while (!p.name.empty() && (p.name.back() == '\n' || p.name.back() == '\0')) p.name.pop_back();
  return p;
}

namespace {

std::string command_line() {
  std::string cmd = read_small("/proc/self/cmdline");
  for (char& c : cmd) c = c == '\0' ? ' ' : c;
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  if (cmd.size() > 240) cmd = cmd.substr(0, 237) + "...";
  return cmd;
}

json to_json(const ProcessId& p) {
  return {{"pid", p.pid}, {"start_ticks", p.start_ticks}, {"host", p.host}, {"name", p.name}};
}

ProcessId from_json(const json& j) {
  ProcessId p;
  p.pid = j.value("pid", int64_t{0});
  p.start_ticks = j.value("start_ticks", uint64_t{0});
  p.host = j.value("host", std::string());
  p.name = j.value("name", std::string());
  return p;
}

std::string utc(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string ago(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 120) return fmt::format("{} s ago", seconds);
  if (seconds < 7200) return fmt::format("{} min ago", seconds / 60);
  return fmt::format("{:.1f} h ago", static_cast<double>(seconds) / 3600.0);
}

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The record in the lock file, {} when it is empty or unreadable (a holder between creating the
// file and writing its record).
json read_record(int fd) {
  std::string text;
  char buf[4096];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    at += n;
    if (text.size() > (1 << 16)) break;
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

std::string holder_text(const json& r) {
  if (r.empty()) return "another process (it has not written its record yet)";
  return fmt::format("`{}` (pid {} on host {}), since {} ({})", r.value("command", std::string("?")),
                     r.value("pid", int64_t{0}), r.value("host", std::string("?")),
                     utc(r.value("since_unix", int64_t{0})), ago(now_unix() - r.value("since_unix", int64_t{0})));
}

}  // namespace

ProcessId this_process() { return process_id(::getpid()); }

ProcessId parent_process() { return process_id(::getppid()); }

bool process_alive(const ProcessId& p) {
  if (p.pid <= 0 || p.host != host_name()) return false;
  uint64_t start = 0;
  if (!read_start_ticks(p.pid, &start)) return false;
  return start == p.start_ticks;
}

FolderLock::FolderLock(const std::string& folder, const Options& options)
    : path_((std::filesystem::path(folder) / "run.lock").string()) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw runtime_error("cannot create run folder {}: {}", folder, ec.message());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error("cannot open the run folder's lock {}: {}", path_, errno_text(errno));
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const json held = read_record(fd_);
      ::close(fd_);
      fd_ = -1;
      throw bad_input(
          "run folder {} is in use by {}. Two runs in one folder would overwrite each other's checkpoints and "
          "metrics: wait for it to end (or stop it), or choose another run.name",
          folder, holder_text(held));
    }
    // NFS without a lock manager, some FUSE file systems: no locking to be had.
    log_warn("run folder {}: cannot lock {} ({}); two runs started on this folder would not be told apart", folder,
             path_, errno_text(err));
  }
  const json previous = read_record(fd_);
  if (previous.contains("launcher")) {
    const ProcessId was = from_json(previous["launcher"]);
    const bool mine = options.launcher && options.launcher->pid == was.pid &&
                      options.launcher->start_ticks == was.start_ticks && options.launcher->host == was.host;
    if (!mine && process_alive(was)) {
      ::close(fd_);
      fd_ = -1;
      throw bad_input(
          "run folder {} belongs to a launch that is restarting its ranks: {} (pid {} on host {}) started `{}` there "
          "{}; wait for that launch to end (or stop it), or choose another run.name",
          folder, was.name, was.pid, was.host, previous.value("command", std::string("?")),
          ago(now_unix() - previous.value("since_unix", int64_t{0})));
    }
  }
  const ProcessId me = this_process();
  json record = {{"pid", me.pid},       {"start_ticks", me.start_ticks}, {"host", me.host},
                 {"command", command_line()}, {"since_unix", now_unix()}, {"since", utc(now_unix())}};
  if (options.launcher) record["launcher"] = to_json(*options.launcher);
  const std::string text = record.dump() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    log_warn("run folder {}: cannot write the holder's record into {}: {}", folder, path_, errno_text(errno));
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace crucible
