// One writer per folder: FolderLock holds an exclusive flock on "<folder>/run.lock" for as long
// as it lives. The kernel drops the lock when the holder exits, however it exits (SIGKILL, a
// crash, a lost node's process), so a killed run never leaves a stale lock behind. The file also
// carries a record of the holder (pid, host, since when, its command line), which a refused
// process names. Torch-free, Linux.
//
// A run under a launcher is held once for the whole group: only rank 0 takes the lock, and it
// records the launcher (its parent process). Between a launcher's restarts no rank holds the
// flock, so a process that finds the lock free but recorded by a launcher still alive on this
// host (pid and start time) that is not its own is refused too: the folder still belongs to that
// launch. A process of the same launcher (a restarted rank 0) takes it back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace crucible {

// A process as another can recognise it later: pid reuse is told apart by the start time.
struct ProcessId {
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // /proc/<pid>/stat's starttime (clock ticks after boot)
  std::string host;          // gethostname
  std::string name;          // /proc/<pid>/comm: "crucible", "torchrun", "slurmstepd"
};
ProcessId process_id(int64_t pid);  // the process `pid` of this host as it is now
ProcessId this_process();
ProcessId parent_process();
// Whether `p` is a process running now on this host (same pid, same start time).
bool process_alive(const ProcessId& p);

class FolderLock {
 public:
  struct Options {
    // The holder's launcher (crucible launch, torchrun's agent, slurmstepd): the folder stays
    // this launch's between its restarts. nullopt: not launched.
    std::optional<ProcessId> launcher;
  };
  // Creates `folder` when missing and takes its lock. Throws bad_input naming the holder (what
  // runs, pid, host, since when and for how long) when another process holds it, and
  // runtime_error when the lock file cannot be created. On a file system without flock it warns
  // and goes on unlocked.
  FolderLock(const std::string& folder, const Options& options);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const { return path_; }  // <folder>/run.lock

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace crucible
