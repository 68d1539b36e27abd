// One run per folder (issue 35): FolderLock refuses a second holder naming the first (pid, host,
// since when), a killed holder leaves nothing behind, and a launcher keeps its folder between
// restarts of its ranks while it lives.
#include "crucible/core/folder_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

// A process that takes the folder's lock, says so on a pipe, and holds it until killed.
class Holder {
 public:
  explicit Holder(const std::string& folder) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      try {
        FolderLock lock(folder, {});
        const char ok = 'y';
        (void)!::write(fds[1], &ok, 1);
        for (;;) ::pause();
      } catch (...) {
        ::_exit(3);
      }
    }
    ::close(fds[1]);
    char c = 0;
    EXPECT_EQ(::read(fds[0], &c, 1), 1) << "the holder did not get the lock";
    ::close(fds[0]);
  }
  ~Holder() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
};

TEST(FolderLock, ASecondHolderIsRefusedNamingTheFirst) {
  test::TempDir d;
  const std::string folder = d / "run";
  Holder first(folder);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  test::expect_bad_input([&] { FolderLock second(folder, {}); },
                         {"run folder", "is in use by", ("pid " + std::to_string(first.pid())).c_str(), host, "since",
                          "s ago", "run.name"});
  // The record the refusal read is the holder's.
  const auto record = nlohmann::json::parse(read_file(folder + "/run.lock"));
  EXPECT_EQ(record["pid"], first.pid());
  EXPECT_EQ(record["host"], host);
  EXPECT_FALSE(record.contains("launcher"));
}

TEST(FolderLock, AKilledHolderLeavesNoLockBehind) {
  test::TempDir d;
  const std::string folder = d / "run";
  Holder first(folder);
  first.kill();  // SIGKILL: no destructor, no cleanup; the kernel drops the flock
  FolderLock again(folder, {});
  EXPECT_EQ(nlohmann::json::parse(read_file(folder + "/run.lock"))["pid"], ::getpid());
}

TEST(FolderLock, OneProcessCannotHoldItTwice) {
  test::TempDir d;
  FolderLock a(d.path(), {});
  test::expect_bad_input([&] { FolderLock b(d.path(), {}); }, {"is in use by"});
}

TEST(FolderLock, ALiveLauncherKeepsItsFolderBetweenRestarts) {
  test::TempDir d;
  test::Child launcher({"sleep", "60"}, d.path());
  ProcessId who = process_id(launcher.pid());
  for (int i = 0; i < 200 && who.name != "sleep"; ++i) {  // until the child has exec'd sleep
    ::usleep(20000);
    who = process_id(launcher.pid());
  }
  ASSERT_TRUE(process_alive(who));
  { FolderLock rank0(d.path(), {who}); }  // rank 0 of the launch ended; the launch restarts
  // Another run is refused while the launcher lives, naming it and what it ran there.
  test::expect_bad_input([&] { FolderLock other(d.path(), {}); },
                         {"belongs to a launch", "sleep", ("pid " + std::to_string(launcher.pid())).c_str()});
  // The launch's own restarted rank 0 takes it back.
  { FolderLock restarted(d.path(), {who}); }
  // A process that reuses nothing of it: another start time is another process.
  ProcessId impostor = who;
  impostor.start_ticks += 1;
  EXPECT_FALSE(process_alive(impostor));
  launcher.kill();
  launcher.wait();
  EXPECT_FALSE(process_alive(who));
  FolderLock after(d.path(), {});  // the launch is over: the folder is free
}

}  // namespace
}  // namespace crucible
