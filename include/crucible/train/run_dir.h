// RunDir: a run's folder <run.dir>/<run.name>/ — config.toml (the resolved job), train.log,
// metrics.jsonl, summary.json, checkpoints/, tb/ (TensorBoard). Rank 0 owns it (law 4): it creates it, discards
// it on --restart, refuses --resume of nothing, and refuses to continue a run whose stored
// config differs from this job in a key that changes results (listing each difference).
// Other ranks only read its checkpoints. Rank 0 holds the folder's lock (core/folder_lock.h) for
// the run's life: a second run on a folder in use is refused naming the holder. Not thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crucible/core/folder_lock.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/job_config.h"

namespace crucible::train {

// The job as TOML, every key resolved (config.toml, checkpoints' "config").
std::string resolved_toml(const JobConfig& job);
// The keys that change results (not run.*, not cosmetic), as (full name, TOML value): the
// hyperparameters TensorBoard's HParams tab shows.
std::vector<std::pair<std::string, std::string>> hyperparameters(const JobConfig& job);

class RunDir {
 public:
  // `launcher`: the process that may restart this run's ranks (crucible launch, torchrun), which
  // keeps the folder between restarts; nullopt when not under one.
  RunDir(const JobConfig& job, bool resume, bool restart, bool main_rank,
         std::optional<ProcessId> launcher = std::nullopt);
  ~RunDir();

  const std::string& path() const { return path_; }
  CheckpointManager& checkpoints() { return *checkpoints_; }
  std::string metrics_path() const;
  std::string tensorboard_dir() const;
  // Writes summary.json atomically (rank 0).
  void write_summary(const std::string& text) const;

 private:
  std::string path_;
  std::unique_ptr<FolderLock> lock_;  // rank 0's
  std::unique_ptr<CheckpointManager> checkpoints_;
};

}  // namespace crucible::train
