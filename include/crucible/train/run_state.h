// RunState: where a run is and what it has spent — everything a checkpoint holds besides
// tensors — and CheckpointIO, through which the Trainer lists the checkpoint's contents once:
// the same list writes a checkpoint (writer) and reads it back (reader, with one checked copy
// per tensor), so a field cannot be saved and forgotten on resume. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "crucible/train/checkpoint.h"

namespace torch::nn {
class Module;
}

namespace crucible::nn {
class Model;
}

namespace crucible::train {

struct RunState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // current epoch (0-based)
  int64_t batch_in_epoch = 0;  // batches of `epoch` already trained on
  int64_t samples = 0;         // training samples consumed
  double step_seconds = 0;     // time in training steps (all sessions)
  double train_seconds = 0;    // steps + evaluation (all sessions)
  double data_wait_seconds = 0;
  int64_t interval_samples = 0;  // samples in the current log interval
  double interval_seconds = 0;   // time in steps of the current log interval
  double last_test_acc = -1, last_test_loss = 0;
  double last_test_top5 = -1;  // top-k (k = min(5, classes)); -1 also from a checkpoint older than the field
  int64_t last_eval_step = -1;
  std::vector<double> last_test_coco;  // a detector's: COCO's 12 numbers (data::coco_stat_names order)
};

class CheckpointIO {
 public:
  // Fills `out`.
  static CheckpointIO writer(CheckpointData& out);
  // Reads `in` (from `path`, named in errors).
  static CheckpointIO reader(const CheckpointData& in, std::string path);

  bool reading() const { return in_ != nullptr; }
  // The checkpoint itself, for parts that read and write their own fields (GradScaler).
  const CheckpointData* input() const { return in_; }
  CheckpointData* output() const { return out_; }
  const std::string& path() const { return path_; }

  // A tensor: written as is; read by a copy into `t`, which must have the saved shape.
  // `required` = false: a checkpoint from before the field existed leaves `t` as it is.
  void tensor(const std::string& name, at::Tensor& t, bool required = true);
  // Every parameter then buffer of `module` as `prefix` + its name.
  void module(const std::string& prefix, torch::nn::Module& module);
  // The same for any model (a torch::nn one or a TorchScript one): its named parameters, then
  // its named buffers.
  void model(const std::string& prefix, nn::Model& model);
  // Tensors under `prefix` handed over as a list (optimizer state): `get` gives them to write,
  // `set` takes them (the prefix removed) when reading.
  void tensor_list(const std::string& prefix, const std::function<std::vector<NamedTensor>()>& get,
                   const std::function<void(const std::vector<NamedTensor>&)>& set);
  // A tensor read and written through functions (generator states).
  // Returns whether it was found (always true when writing).
  bool tensor_via(const std::string& name, const std::function<at::Tensor()>& get,
                  const std::function<void(const at::Tensor&)>& set, bool required = true);
  // Metadata values.
  void value(const std::string& key, int64_t& v);
  void value(const std::string& key, double& v);  // written exactly (%.17g)
  void value(const std::string& key, std::string& v);
  // Written only (provenance: versions, the resolved config).
  void note(const std::string& key, const std::string& v);

  // RunState's fields.
  void state(RunState& st);

 private:
  CheckpointIO(CheckpointData* out, const CheckpointData* in, std::string path)
      : out_(out), in_(in), path_(std::move(path)) {}
  CheckpointData* out_;
  const CheckpointData* in_;
  std::string path_;
};

struct Job;

// A run's checkpoint, listed once: the model, optimizer, generators, the interval's sums, `st`,
// the scaler, the step's counters, every step observer's fields and the provenance notes.
// Written at every checkpoint through a writer; read back on resume through a reader (which
// checks that the checkpoint was written for this job's total steps).
void job_checkpoint_fields(CheckpointIO& io, Job& job, RunState& st);

}  // namespace crucible::train
