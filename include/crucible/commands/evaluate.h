// `crucible eval`: the model of a checkpoint (default: the newest that verifies in the run
// folder), or with --weights ema its weight EMA (train.ema), on the whole test set, writing
// nothing. Under data parallel the test set is sharded, per-sample results gathered and the
// padding dropped (X2), so the figures equal a single process's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"

namespace crucible::commands {

struct EvalSummary {
  std::string checkpoint;  // the file evaluated
  double test_acc = 0;     // 0–1
  double test_top5 = 0;    // 0–1, top-k with k = min(5, classes)
  double test_loss = 0;
  std::vector<double> test_coco;  // a detector's COCO numbers (data::coco_stat_names order); empty otherwise
  std::string coco_summary;       // … and the 12 lines COCOeval.summarize() prints
  int64_t step = 0;  // the checkpoint's training step
  std::string params_sha256;  // of the weights evaluated (with ema: summary.json's ema_sha256 at that step)
  std::string weights = "model";  // a weight set (train/weight_set.h): "model", "ema"
};

// bad_input when there is no checkpoint to evaluate, or it does not hold the weight set `weights`.
EvalSummary evaluate_checkpoint(const train::JobConfig& config, const std::string& checkpoint = "",
                                const std::string& weights = "model");

}  // namespace crucible::commands
