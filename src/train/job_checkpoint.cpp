// A run's checkpoint contents, listed once (see run_state.h): the loop writes them, the Session
// reads them back on resume.
#include <ATen/ATen.h>

#include <fmt/format.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/nn/model.h"
#include "crucible/train/job.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/run_dir.h"
#include "crucible/train/run_state.h"
#include "crucible/train/step.h"

#ifndef CRUCIBLE_VERSION
#define CRUCIBLE_VERSION "0.0.0"
#endif

namespace crucible::train {

void job_checkpoint_fields(CheckpointIO& io, Job& j, RunState& st) {
  io.model("model.", *j.model);
  io.tensor_list("optim.", [&j] { return j.optimizer->state(); },
                 [&j](const std::vector<NamedTensor>& s) { j.optimizer->load_state(s); });
  io.tensor_via("rng.torch_cpu", [] { return compat::cpu_generator_state(); },
                [](const at::Tensor& t) { compat::set_cpu_generator_state(t); });
  if (j.device.is_cuda()) {  // its dropout
    const bool found = io.tensor_via("rng.torch_cuda", [&j] { return compat::generator_state(j.device); },
                                     [&j](const at::Tensor& t) { compat::set_generator_state(j.device, t); },
                                     /*required=*/false);
    if (!found) {
      log_warn("{}: no GPU generator state (saved by a CPU run, or before it was kept): dropout on {} draws "
               "from a fresh stream, so this resume is not bit-exact",
               io.path(), j.device.str());
    }
  }
  IntervalSums& sums = j.step->sums();
  io.tensor("metrics.loss_sum", sums.loss_sum);
  io.tensor("metrics.correct", sums.correct);
  if (io.reading()) sums.grad_norm_max.zero_(), sums.clipped_norm_max.zero_();  // absent before issue 10
  io.tensor("metrics.grad_norm_max", sums.grad_norm_max, /*required=*/false);
  io.tensor("metrics.clipped_norm_max", sums.clipped_norm_max, /*required=*/false);
  io.state(st);
  int64_t saved_total = j.total_steps;
  io.value("total_steps", saved_total);
  if (io.reading() && saved_total != j.total_steps) {
    throw bad_input("{}: checkpoint was written for {} total steps, this job has {}", io.path(), saved_total,
                    j.total_steps);
  }
  io.note("precision", j.precision.value.dtype_name());
  io.note("memory_format", j.precision.value.memory_format_name());
  io.note("model_input", j.model_input.to_json());  // law 3 (read before assembly: StoredChoices)
  io.note("num_classes", std::to_string(j.num_classes));  // predict needs no training data
  if (io.reading()) {
    j.scaler.restore(*io.input(), io.path());  // T1
  } else {
    j.scaler.save(*io.output());
  }
  StepCounters& counters = j.step->counters();
  io.value("skipped_steps", counters.skipped_steps);
  io.value("bad_in_row", counters.bad_in_row);
  io.value("oom_retries", counters.oom_retries);
  for (auto& o : j.observers) o->checkpoint_fields(io);
  io.note("config", resolved_toml(j.config));
  io.note("crucible_version", CRUCIBLE_VERSION);
  io.note("torch_version", compat::torch_version());
}

}  // namespace crucible::train
