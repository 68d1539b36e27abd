// `crucible eval` (see evaluate.h).
#include "crucible/commands/evaluate.h"

#include <algorithm>
#include <chrono>

#include "crucible/data/eval/coco_eval.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/session.h"

namespace crucible::commands {

EvalSummary evaluate_checkpoint(const train::JobConfig& config, const std::string& checkpoint,
                                const std::string& weights) {
  const std::unique_ptr<train::Session> session = train::Session::open_inference(
      config,
      {"eval", checkpoint, /*config_weights=*/false, "give --checkpoint FILE or the run's run.dir/run.name", weights});
  train::Job& job = session->job();
  const auto t0 = std::chrono::steady_clock::now();
  job.sync_bn_buffers();  // M2: every rank evaluates with the same statistics
  const train::EvalResult r = job.evaluator->run();
  train::log_eval(session->checkpoint_step(), r, job.comm ? job.world.size : 0,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EvalSummary s;
  s.checkpoint = session->checkpoint();
  s.test_acc = r.acc;
  s.test_top5 = r.top5;
  s.test_loss = r.loss;
  s.test_coco = r.coco;
  if (r.detection()) {
    data::CocoEvalResult c;
    std::copy(r.coco.begin(), r.coco.end(), c.stats.begin());
    s.coco_summary = c.summary();
  }
  s.step = session->checkpoint_step();
  s.params_sha256 = train::params_sha256(*job.model);
  s.weights = session->weights();
  return s;
}

}  // namespace crucible::commands
