// The launcher's progress file as a step observer: under crucible launch
// (CRUCIBLE_LAUNCH_PROGRESS_DIR), each rank keeps the step it is at in <dir>/rank<R>, so the
// launcher can place a failure and recognise a repeat at the same step (distributed/launch.h).
// A hint only: a write that fails closes the file and the run goes on.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/distributed/launch.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/job.h"

namespace crucible::train {
namespace {

class LaunchProgress final : public StepObserver {
 public:
  explicit LaunchProgress(std::string path) : path_(std::move(path)) {}
  ~LaunchProgress() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void before_step(const DeviceBatch& batch) override {
    if (!opened_) {  // on the first step: a command that takes none leaves no file
      opened_ = true;
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) log_warn("{}: cannot open {}: {}", distributed::kProgressDirEnv, path_, errno_text(errno));
    }
    if (fd_ < 0) return;
    const int64_t step = batch.step;
    if (::pwrite(fd_, &step, sizeof step, 0) != static_cast<ssize_t>(sizeof step)) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  void after_update(const StepEvent&) override {}
  std::string describe() const override { return ""; }

 private:
  std::string path_;
  bool opened_ = false;
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<StepObserver> make_launch_progress(const Job& job) {
  if (job.env.launch_progress_dir.empty()) return nullptr;
  return std::make_unique<LaunchProgress>(fmt::format("{}/rank{}", job.env.launch_progress_dir, job.world.rank));
}

}  // namespace crucible::train
