// RunDir (see run_dir.h).
#include "crucible/train/run_dir.h"

#include <filesystem>

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/folder_lock.h"
#include "crucible/core/log.h"
#include "crucible/data/data_recipe.h"

namespace crucible::train {

namespace fs = std::filesystem;

std::string resolved_toml(const JobConfig& job) {
  JobConfig copy = job;
  ConfigSchema schema;
  bind_job_config(copy, schema);
  return schema.to_toml();
}

std::vector<std::pair<std::string, std::string>> hyperparameters(const JobConfig& job) {
  JobConfig copy = job;
  ConfigSchema schema;
  bind_job_config(copy, schema);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [name, value] : schema.values()) {
    if (name.rfind("run.", 0) == 0 || key_is_cosmetic(name)) continue;
    out.emplace_back(name, value);
  }
  return out;
}

RunDir::RunDir(const JobConfig& job, bool resume, bool restart, bool main_rank, std::optional<ProcessId> launcher)
    : path_((fs::path(job.run.dir) / job.run.name).string()) {
  const std::string ckpt_dir = (fs::path(path_) / "checkpoints").string();
  if (!main_rank) {  // rank 0 owns the run folder (law 4); the others read its checkpoints
    checkpoints_ = std::make_unique<CheckpointManager>(ckpt_dir, job.checkpoint.keep);
    return;
  }
  const bool existed = fs::exists(path_);
  if (resume && !existed) {
    throw bad_input("--resume: run folder {} does not exist (nothing to resume; drop --resume to start)", path_);
  }
  // One run per folder, taken before anything in it changes (--restart's discarding included).
  lock_ = std::make_unique<FolderLock>(path_, FolderLock::Options{std::move(launcher)});
  if (restart && existed) {
    log_info("--restart: discarding the previous run in {}", path_);
    for (const char* f : {"metrics.jsonl", "summary.json", "train.log", "config.toml"}) fs::remove(fs::path(path_) / f);
    fs::remove_all(tensorboard_dir());
    fs::remove_all(ckpt_dir);
  }
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec) throw runtime_error("cannot create run folder {}: {}", ckpt_dir, ec.message());
  checkpoints_ = std::make_unique<CheckpointManager>(ckpt_dir, job.checkpoint.keep);

  // A rerun into an existing run continues it, but only with the same job (cosmetic keys such
  // as logging may change).
  const std::string config_path = (fs::path(path_) / "config.toml").string();
  const std::string toml = resolved_toml(job);
  if (fs::exists(config_path) && !checkpoints_->list().empty()) {
    JobConfig stored_job;
    ConfigSchema stored;
    bind_job_config(stored_job, stored);
    stored.load_file(config_path);
    JobConfig now_job = job;
    ConfigSchema now;
    bind_job_config(now_job, now);
    auto a = stored.values(), b = now.values();
    std::string diffs;
    // A fixed global batch makes the per-rank batch follow the world size: a resume on another
    // number of ranks is the same run (elastic).
    const bool elastic = stored_job.train.global_batch_size > 0 &&
                         stored_job.train.global_batch_size == now_job.train.global_batch_size;
    for (size_t i = 0; i < a.size(); ++i) {
      if (elastic && a[i].first == "train.batch_size") continue;
      // Where the folder is, not what it holds: a run folder copied or moved elsewhere resumes.
      if (a[i].first == "run.dir" || a[i].first == "run.name") continue;
      // "auto" (the default since issue 37) is the order it picks: a folder that names it resumes.
      if (a[i].first == "data.sampler" &&
          data::resolved_sampler(stored_job.data) == data::resolved_sampler(now_job.data)) {
        continue;
      }
      if (a[i].second != b[i].second && !key_is_cosmetic(a[i].first)) {
        diffs += fmt::format("\n  {}: run has {}, now {}", a[i].first, a[i].second, b[i].second);
      }
    }
    if (!diffs.empty()) {
      throw bad_input("run folder {} holds a run with a different configuration:{}\nresume it with its own config, "
                      "choose another run.name, or pass --restart to discard it",
                      path_, diffs);
    }
  }
  write_file_atomic(config_path, toml);
  set_log_file((fs::path(path_) / "train.log").string());
}

RunDir::~RunDir() = default;

std::string RunDir::metrics_path() const { return (fs::path(path_) / "metrics.jsonl").string(); }
std::string RunDir::tensorboard_dir() const { return (fs::path(path_) / "tb").string(); }

void RunDir::write_summary(const std::string& text) const {
  write_file_atomic((fs::path(path_) / "summary.json").string(), text);
}

}  // namespace crucible::train
