// Session: opening and finishing a run (see session.h).
#include "crucible/train/session.h"

#include <ATen/ATen.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/loader/loader.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/model.h"
#include "crucible/obs/metric_sink.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/doctor_checks.h"
#include "crucible/train/eval_images.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/run_dir.h"
#include "crucible/train/sinks.h"
#include "crucible/train/step.h"
#include "crucible/train/weight_set.h"

namespace crucible::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string checkpoint_dir(const JobConfig& c) { return (fs::path(c.run.dir) / c.run.name / "checkpoints").string(); }

// The newest checkpoint that verifies in <run.dir>/<run.name>/checkpoints into `path`; false
// when the folder does not exist or holds none.
bool newest_checkpoint(const JobConfig& c, std::string* path) {
  const std::string dir = checkpoint_dir(c);
  return fs::is_directory(dir) && CheckpointManager(dir, 1).load_latest(path).has_value();
}

std::string no_checkpoint_reason(const JobConfig& c) {
  const std::string dir = checkpoint_dir(c);
  return fs::is_directory(dir) ? fmt::format("{} holds no checkpoint that verifies", dir)
                               : fmt::format("{} does not exist (no run named {} in {})", dir, c.run.name, c.run.dir);
}

}  // namespace

bool export_model(nn::Model& model, const std::string& run_dir, const std::string& stem) {
  const std::string st = run_dir + "/" + stem + ".safetensors";
  const std::string program = model.save_program(run_dir, stem);
  if (program.empty()) return false;
  std::vector<at::Tensor> keep;
  std::vector<nn::NamedTensor> all = model.named_parameters();
  for (auto& b : model.named_buffers()) all.push_back(std::move(b));
  keep.resize(all.size());
  std::vector<io::TensorBytes> bytes;
  for (size_t i = 0; i < all.size(); ++i) {
    // outside the step: the end-of-run export
    bytes.push_back(io::tensor_bytes(all[i].name, all[i].tensor.detach().to(at::kCPU), keep[i]));
  }
  io::write_safetensors(st, bytes, {});
  log_info("trained {} → {} ({}) and {} (safetensors, state_dict names)", stem, program,
           program.size() > 4 && program.compare(program.size() - 4, 4, ".pt2") == 0 ? "torch.export" : "TorchScript", st);
  return true;
}

Session::Session() : sinks_(std::make_unique<obs::MetricSinks>()) {}
Session::~Session() = default;

std::unique_ptr<Session> Session::open_train(JobConfig config, TrainFlags flags) {
  std::unique_ptr<Session> s(new Session());
  s->flags_ = std::move(flags);
  s->job_ = join_job(std::move(config));
  Job& job = *s->job_;
  // Under a launcher that restarts ranks, the folder stays the launch's between restarts (its
  // process is rank 0's parent: crucible launch and torchrun start the ranks themselves).
  std::optional<ProcessId> launcher;
  if (!job.world.run_id.empty()) launcher = parent_process();
  s->dir_ = std::make_unique<RunDir>(job.config, s->flags_.resume, s->flags_.restart, job.main_rank(), launcher);
  std::optional<CheckpointData> ckpt;
  s->choose_checkpoint(&ckpt);
  assemble_job(job, ckpt ? StoredChoices::of(*ckpt, s->checkpoint_) : StoredChoices{}, s->dir_->checkpoints().dir());
  s->check_disk();
  if (job.world.restarts > 0) {
    log_warn("launch restart {} of this run (TORCHELASTIC_RESTART_COUNT){}", job.world.restarts,
             job.world.restart_causes.empty() ? "" : "; causes so far: " + job.world.restart_causes);
  }
  s->restore(ckpt);
  if (!s->already_complete()) make_sinks({job, *s->dir_, s->st_.step, s->flags_.report_defaults_toml}, *s->sinks_);
  return s;
}

// The checkpoint this run resumes from, chosen by rank 0 after any --restart cleanup and read by
// every rank (X3).
void Session::choose_checkpoint(std::optional<CheckpointData>* ckpt) {
  Job& job = *job_;
  if (job.main_rank()) *ckpt = dir_->checkpoints().load_latest(&checkpoint_);
  if (!job.comm) return;
  checkpoint_ = job.comm->broadcast_string("resume", *ckpt ? checkpoint_ : std::string(), 0);
  if (job.main_rank() || checkpoint_.empty()) return;
  try {
    *ckpt = read_checkpoint(checkpoint_);
  } catch (const Error& e) {
    throw runtime_error("rank {} cannot read the checkpoint rank 0 resumes from (is {} shared between the "
                        "machines?): {}",
                        job.world.rank, dir_->checkpoints().dir(), e.what());
  }
}

// Law 4: rank 0 writes the run folder, so its disk is the one to check.
void Session::check_disk() {
  Job& job = *job_;
  if (!job.main_rank()) return;
  const DoctorCheck disk = train::check_disk(job.config, checkpoint_bytes(job.config, *job.model, *job.optimizer),
                                           static_cast<int64_t>(dir_->checkpoints().list().size()));
  if (disk.status == DoctorCheck::Status::kFail) throw bad_input("disk: {}; {}", disk.found, disk.fix);
  if (disk.status == DoctorCheck::Status::kWarn) log_warn("disk: {}. {}", disk.found, disk.fix);
}

// Restores the checkpoint's state (and rewinds the sinks' files to it), or starts afresh; then
// every replica takes rank 0's weights.
void Session::restore(const std::optional<CheckpointData>& ckpt) {
  Job& job = *job_;
  if (ckpt) {
    CheckpointIO io = CheckpointIO::reader(*ckpt, checkpoint_);
    job_checkpoint_fields(io, job, st_);
    checkpoint_step_ = st_.step;
    record_.resumed_from = st_.step;
    log_info("resumed from {}: step {} (epoch {}, batch {} of {})", checkpoint_, st_.step, st_.epoch + 1,
             st_.batch_in_epoch, job.steps_per_epoch);
    rewind_sinks(job, *dir_, st_.step);  // records past the checkpoint will be written again
  } else {
    if (flags_.resume) throw bad_input("--resume: {} holds no checkpoint that verifies", dir_->checkpoints().dir());
    rewind_sinks(job, *dir_, std::nullopt);
  }
  // Every replica starts from rank 0's weights, whatever its own initialisation or resume did.
  if (job.comm) distributed::broadcast_module(*job.comm, *job.model, 0);
}

std::unique_ptr<Session> Session::open_inference(JobConfig config, const WeightsRequest& request) {
  std::unique_ptr<Session> s(new Session());
  s->job_ = join_job(std::move(config));
  Job& job = *s->job_;
  job.inference = true;  // the test split alone
  std::string path = request.checkpoint;
  if (job.main_rank() && path.empty() && !newest_checkpoint(job.config, &path) && !request.config_weights) {
    throw bad_input("{}: {}; {}", request.command, no_checkpoint_reason(job.config), request.hint);
  }
  if (job.comm) path = job.comm->broadcast_string(request.command, path, 0);  // empty: the config's own weights
  const WeightSet& set = weight_set_registry().get(request.weights, request.command + " --weights").factory;
  s->weights_ = request.weights;
  if (!set.marker.empty() && path.empty()) {  // a set that only a checkpoint holds
    throw bad_input("{} --weights {}: there is no checkpoint to take the {} from ({}); give --checkpoint FILE of {}",
                    request.command, request.weights, set.what, no_checkpoint_reason(job.config), set.source);
  }
  if (path.empty()) {
    assemble_job(job, {});  // model.init loads (its log names what it did to the head), or TorchScript's
    return s;
  }
  const CheckpointData ckpt = read_checkpoint(path);
  if (!set.marker.empty() && ckpt.meta.count(set.marker) == 0) {
    throw bad_input("{} --weights {}: {} holds no {} ({}); use --weights model", request.command, request.weights, path,
                    set.what, set.absent);
  }
  assemble_job(job, StoredChoices::of(ckpt, path));
  CheckpointIO::reader(ckpt, path).model(set.prefix, *job.model);
  s->checkpoint_step_ = ckpt.meta_int("step", path);
  s->checkpoint_ = path;
  return s;
}

std::unique_ptr<Session> Session::open_preview(JobConfig config) {
  std::unique_ptr<Session> s(new Session());
  s->job_ = join_job(std::move(config));
  assemble_data_stages(*s->job_);
  return s;
}

const WeightSet& Session::weight_set() const { return weight_set_registry().get(weights_, "--weights").factory; }

int64_t Session::stop_step() const {
  const Job& job = *job_;
  return job.config.train.max_steps > 0 ? std::min(job.config.train.max_steps, job.total_steps) : job.total_steps;
}

bool Session::already_complete() const { return st_.step >= stop_step() && st_.last_eval_step == st_.step; }

TrainSummary Session::finish(bool trained) {
  Job& job = *job_;
  if (!trained) {
    log_info("run {} is already complete at step {} ({}); pass --restart to train it again", dir_->path(), st_.step,
             st_.last_test_coco.empty() ? fmt::format("test accuracy {:.2f}%", 100 * st_.last_test_acc)
                                        : fmt::format("test AP {:.4f}", st_.last_test_coco[0]));
    return summarize(/*already_complete=*/true);
  }
  if (job.main_rank()) {
    export_model(*job.model, dir_->path(), "model");
    for (auto& o : job.observers) o->after_training(*job.model, dir_->path());
    if (auto* detector = dynamic_cast<nn::Detector*>(job.model.get()); detector != nullptr && job.detection) {
      // The report's test images with true and predicted boxes (eval_images.h), detected as the
      // evaluation detects them (its autocast).
      const Precision& p = job.precision.value;
      compat::AutocastGuard amp(job.device.type(), autocast_dtype(p), p.mixed());
      write_eval_images(*detector, *job.test_loader, job.device, dir_->path() + "/eval_images.png");
    }
  }
  sinks_->finish(st_.step);
  record_.loader_busy = job.train_loader->busy_seconds();
  TrainSummary summary = summarize(/*already_complete=*/false);
  write_report(job, *dir_, flags_.report_defaults_toml);
  if (job.main_rank() && !summary.bottleneck.empty()) log_info("bottleneck: {}", summary.bottleneck);
  if (data::RemoteIo r; job.train_loader->pipeline().remote_io(&r)) log_info("training data (D11) {}", r.line());
  return summary;
}

TrainSummary Session::summarize(bool already_complete) {
  Job& job = *job_;
  TrainSummary s = train_summary(job, st_, record_, already_complete);
  s.run_dir = dir_->path();
  s.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  json j = summary_json(job, st_, record_, s, record_.last_eval_figures);
  if (job.main_rank()) dir_->write_summary(j.dump(2) + "\n");
  if (j["bottleneck"].is_object()) {
    const json& b = j["bottleneck"];
    s.bottleneck = fmt::format("{}: {}: {}", b["verdict"].get<std::string>(), b["evidence"].get<std::string>(),
                               b["fix"].get<std::string>());
  }
  return s;
}

}  // namespace crucible::train
