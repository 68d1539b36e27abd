// Job: everything a JobConfig builds, assembled in named stages (assembly.cpp) — the world
// this process joined, the data and its loaders, the model and loss, the precision, the
// optimizer and schedule, data-parallel sync, the step and the evaluator, and the recipe's
// batch transforms and step observers. The Trainer runs the loop over a Job; the commands
// (predict, eval, …) use one without the loop. Not thread-safe: one Job per process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "crucible/distributed/world.h"
#include "crucible/nn/collective.h"
#include "crucible/nn/model.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/environment.h"
#include "crucible/train/grad_scaler.h"
#include "crucible/train/job_config.h"
#include "crucible/train/optimizer.h"  // NamedTensor
#include "crucible/train/precision.h"
#include "crucible/train/step_observer.h"

namespace crucible::data {
struct CocoGroundTruth;
class Loader;
class DeviceInput;
class DeviceFeeder;
}  // namespace crucible::data
namespace crucible::distributed {
class Comm;
class GradSync;
}  // namespace crucible::distributed
namespace crucible::obs {
class PhaseClock;
class LayerProfiler;
}  // namespace crucible::obs

namespace crucible::train {

class Loss;
class Schedule;
class TrainStep;
class Evaluator;
struct CheckpointData;

// What a checkpoint fixes before a job is assembled: the precision and memory format it chose
// (auto may time differently now) and the input convention its model was trained on (law 3).
struct StoredChoices {
  std::optional<Precision> precision;
  std::optional<nn::InputSpec> input;
  std::string input_source;      // the checkpoint's path, for messages
  bool from_checkpoint = false;  // weights come from a checkpoint: no model.init
  std::optional<int64_t> num_classes;  // the classes the model was trained on (absent before issue 28)
  // From checkpoint `ckpt` read from `path` (bad_input for malformed fields).
  static StoredChoices of(const CheckpointData& ckpt, const std::string& path);
};

struct Job {
  Job();
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  JobConfig config;
  Environment env;  // the environment variables the train layer reads, read when the job is joined

  // The world (law 7): one process per device; a null comm is a single process.
  distributed::World world;
  std::unique_ptr<distributed::Comm> comm;
  c10::Device device{c10::kCPU};
  std::string determinism_env;  // what set_deterministic did to the environment (for the log)
  bool main_rank() const { return world.rank == 0; }
  // eval and predict: only the test split is opened (data.train_* need not exist), and the
  // model's classes are the checkpoint's when it records them.
  bool inference = false;

  // Data.
  std::unique_ptr<data::Loader> train_loader, test_loader;
  int loader_threads = 1;
  std::string loader_choice;  // how data.threads = 0 chose (empty when set)
  int64_t num_classes = 0;
  int64_t steps_per_epoch = 0, total_steps = 0;
  // Detection (data.dataset = "detection"): images with boxes, a detector, COCO's numbers
  // against the test split's ground truth.
  bool detection = false;
  std::shared_ptr<const data::CocoGroundTruth> test_truth;

  // Model, loss and input (law 3).
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<data::DeviceInput> input;
  std::unique_ptr<data::DeviceFeeder> feeder;  // D9: the training batches onto the device, ahead on a GPU
  nn::InputSpec model_input;  // what the model takes (saved in checkpoints)

  // Precision.
  PrecisionChoice precision;  // as configured, resumed, or timed ("auto")
  GradScaler scaler;
  bool cpu_bf16 = false;  // this CPU computes bf16 in hardware (cpu_bf16_flag says why)
  std::string cpu_bf16_flag;
  std::string doctor_json;  // the start-up checks (summary.json "doctor"); rank 0 only

  // Optimization: what the optimizer updates, in the model's order.
  std::vector<NamedTensor> params;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Schedule> schedule;

  // Data parallel.
  std::unique_ptr<distributed::GradSync> grad_sync;
  nn::LocalCollective local_collective;  // dist.bn = sync in a single process

  // The step, its clocks, evaluation, and the recipe's seams.
  std::unique_ptr<TrainStep> step;
  std::unique_ptr<obs::PhaseClock> clock;
  std::unique_ptr<obs::LayerProfiler> layer_profiler;  // train.profile = "full"
  std::unique_ptr<Evaluator> evaluator;
  BatchTransforms batch_transforms;
  StepObservers observers;

  // M2: the BatchNorm statistics made equal on every rank (dist.bn) before anything reads them.
  void sync_bn_buffers();
};

// Joins the data-parallel job this process was started in (crucible launch, torchrun, SLURM
// through their variables), if any: device from LOCAL_RANK before any collective (T2), then
// the rendezvous and the process group. The rest of the Job is empty.
std::unique_ptr<Job> join_job(JobConfig config);

// The stages after join_job, in order: data, model, precision, optimization, data parallel,
// step. `checkpoint_dir` is named when training diverges (empty for commands).
void assemble_job(Job& job, const StoredChoices& stored, const std::string& checkpoint_dir = "");

// The first stages alone — compute threads, then the data (pipelines with the recipe's sample
// transforms, loader threads, the training loader on the recipe's sampler, the test loader) — for
// a command that reads the training data as training would, without a model (crucible preview).
void assemble_data_stages(Job& job);

// SHA-256 over parameters then buffers in registration order: name, dtype, shape and the
// values in C order (independent of memory format).
std::string params_sha256(nn::Model& model);
// The same digest over `tensors` in their order (a model's parameters then buffers, or a copy
// of them such as the weight EMA's: equal to params_sha256 of a model holding those values).
std::string tensors_sha256(const std::vector<NamedTensor>& tensors);

}  // namespace crucible::train
