// `crucible predict`: each test sample's K most likely classes and their softmax probabilities,
// written in sample order as JSONL or CSV. The Predictor runs on the Evaluator's own pass
// (Evaluator::forward_each: eval mode without gradients, the checkpoint's precision) and its one
// gather (under data parallel the test set is sharded, rows gathered and the padding dropped,
// X2), so its top-1 equals `crucible eval`'s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/train/job_config.h"

namespace crucible::train {
class Evaluator;
}
namespace crucible::data {
struct CocoDetection;
}

namespace crucible::commands {

struct PredictOptions {
  std::string out;         // the file to write: ".jsonl" or ".csv" (anything else is bad_input)
  int64_t top_k = 5;       // K ≥ 1 classes per sample; clamped to the model's class count
  std::string checkpoint;  // the model's weights; empty = the newest checkpoint that verifies in
                           // <run.dir>/<run.name>/checkpoints, or with none there the config's own
                           // (model.init, or a TorchScript model.path)
  std::string weights = "model";  // a weight set of the checkpoint (train/weight_set.h): "model", "ema"
};

enum class PredictFormat {
  kJsonl,  // {"index":i,"label":y,"top":[c1,…,cK],"prob":[p1,…,pK]} per line; multi-label data:
           // "label":[the present classes]
  kCsv,    // header index,label,top1,…,topK,prob1,…,probK; one row per sample; multi-label data:
           // label is the present classes separated by spaces
  kCocoResults,  // ".json", a detector's: COCO's results list [{"image_id", "category_id" (the file's
                 // category ids), "bbox": [x, y, w, h] in the image's pixels, "score"}, …], by image then
                 // score, as pycocotools' loadRes reads it
};

// The format `options.out` names by its extension. bad_input for K < 1 or another extension,
// before any work is done.
PredictFormat check_predict_options(const PredictOptions& options);

// Every sample's prediction, in sample id order (ids 0..N-1 of the test pipeline, each once).
struct Predictions {
  int64_t k = 0;               // classes per sample: min(K, classes)
  int64_t classes = 0;         // the model's output width (0 when no sample was seen)
  std::vector<int64_t> index;  // [n] sample ids, ascending
  std::vector<int64_t> label;  // [n] class index (-1 for multi-label data)
  bool multi_label = false;
  std::vector<std::vector<int64_t>> present;  // multi-label data: [n] the classes present, ascending
  std::vector<int64_t> top;    // [n, k] class ids, best first; equal logits: lower id first (argmax's pick)
  std::vector<double> prob;    // [n, k] the loss's probabilities (computed in double) of those classes:
                               // softmax for cross-entropy, sigmoid per class for binary cross-entropy
  int64_t size() const { return static_cast<int64_t>(index.size()); }
  double top1_accuracy() const;  // fraction with top[0] right (== label, or present), 0–1 (0 when empty)
  double topk_accuracy() const;  // fraction with a right class among the k
};

// The whole file's text. Numbers are written as the shortest decimal that reads back as the
// same double, identically in both formats.
std::string format_predictions(const Predictions& p, PredictFormat format);

// Writes format_predictions(p, format) to `path` atomically (law 5): temp file, fsync, rename;
// a failure leaves no half-written file. runtime_error naming the path.
void write_predictions(const std::string& path, const Predictions& p, PredictFormat format);

class Predictor {
 public:
  // Runs the model of `evaluator` over its test loader, as the evaluator does (it must outlive
  // the predictor). Not thread-safe.
  explicit Predictor(train::Evaluator& evaluator) : evaluator_(evaluator) {}
  // One pass over the loader (epoch 0). Under data parallel every rank returns the whole set.
  Predictions run(int64_t top_k);

 private:
  train::Evaluator& evaluator_;
};

struct PredictSummary;

// `crucible predict`: the model (options.checkpoint; default: the newest checkpoint that
// verifies in the run folder, else the config's own weights) on the whole test set, each
// sample's top-K classes and probabilities written by rank 0 to options.out atomically, in
// sample order; run as `crucible eval` runs it, so the file's top-1 accuracy equals its
// test_acc. bad_input for K < 1, an unknown extension or no model, before any work.
PredictSummary predict(const train::JobConfig& config, const PredictOptions& options);

struct PredictSummary {
  std::string out;    // the file written (by rank 0)
  std::string model;  // where the model came from, in words
  int64_t samples = 0;
  int64_t k = 0;  // after clamping
  int64_t classes = 0;
  int64_t step = 0;     // the checkpoint's training step
  double top1_acc = 0;  // over the file, 0–1
  double topk_acc = 0;
  // A detector's: the detections written and COCO's numbers on them (data::coco_stat_names order),
  // equal to `crucible eval`'s.
  int64_t detections = 0;
  std::vector<double> coco;
};

// COCO's results JSON for `detections` (kCocoResults), numbers as the shortest decimal that
// reads back as the same double.
std::string format_coco_results(const std::vector<data::CocoDetection>& detections);

}  // namespace crucible::commands
