// Predictor and the prediction file formats (see predict.h).
#include "crucible/commands/predict.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/data/eval/coco_eval.h"
#include "crucible/data/loader/loader.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/gather.h"
#include "crucible/train/loss.h"
#include "crucible/train/session.h"
#include "crucible/train/weight_set.h"

namespace crucible::commands {

using namespace crucible::train;

std::string format_coco_results(const std::vector<data::CocoDetection>& detections) {
  std::string out = "[";
  for (size_t i = 0; i < detections.size(); ++i) {
    const data::CocoDetection& d = detections[i];
    // {} formats a double as the shortest decimal that reads back as the same value.
    out += fmt::format("{}{{\"image_id\": {}, \"category_id\": {}, \"bbox\": [{}, {}, {}, {}], \"score\": {}}}",
                       i == 0 ? "\n" : ",\n", d.image_id, d.category_id, d.bbox[0], d.bbox[1], d.bbox[2], d.bbox[3],
                       d.score);
  }
  out += "\n]\n";
  return out;
}

PredictFormat check_predict_options(const PredictOptions& options) {
  if (options.top_k < 1) throw bad_input("predict: --top {}: K must be at least 1", options.top_k);
  if (options.out.empty()) throw bad_input("predict: give --out FILE (.jsonl or .csv)");
  const std::string ext = std::filesystem::path(options.out).extension().string();
  if (ext == ".jsonl") return PredictFormat::kJsonl;
  if (ext == ".csv") return PredictFormat::kCsv;
  if (ext == ".json") return PredictFormat::kCocoResults;
  throw bad_input("predict: --out {}: unknown extension \"{}\"; expected .jsonl (one JSON object per line) or .csv, "
                  "or for a detector .json (COCO results)",
                  options.out, ext);
}

namespace {

// Sample i's prediction `c` is right: the label, or among the present classes.
bool right(const Predictions& p, size_t i, int64_t c) {
  if (!p.multi_label) return c == p.label[i];
  return std::binary_search(p.present[i].begin(), p.present[i].end(), c);
}

}  // namespace

double Predictions::top1_accuracy() const {
  int64_t hits = 0;
  for (int64_t i = 0; i < size(); ++i) hits += right(*this, static_cast<size_t>(i), top[static_cast<size_t>(i * k)]);
  return size() > 0 ? static_cast<double>(hits) / static_cast<double>(size()) : 0.0;
}

double Predictions::topk_accuracy() const {
  int64_t hits = 0;
  for (int64_t i = 0; i < size(); ++i) {
    const auto row = top.begin() + i * k;
    hits += std::any_of(row, row + k, [&](int64_t c) { return right(*this, static_cast<size_t>(i), c); });
  }
  return size() > 0 ? static_cast<double>(hits) / static_cast<double>(size()) : 0.0;
}

std::string format_predictions(const Predictions& p, PredictFormat format) {
  fmt::memory_buffer b;
  auto out = std::back_inserter(b);
  const auto k = static_cast<size_t>(p.k);
  if (format == PredictFormat::kCsv) {
    fmt::format_to(out, "index,label");
    for (size_t j = 1; j <= k; ++j) fmt::format_to(out, ",top{}", j);
    for (size_t j = 1; j <= k; ++j) fmt::format_to(out, ",prob{}", j);
    fmt::format_to(out, "\n");
  }
  for (size_t i = 0; i < p.index.size(); ++i) {
    const int64_t* top = p.top.data() + i * k;
    const double* prob = p.prob.data() + i * k;
    if (format == PredictFormat::kJsonl) {
      const std::string label =
          p.multi_label ? fmt::format("[{}]", fmt::join(p.present[i], ",")) : std::to_string(p.label[i]);
      // fmt's "{}" of a double is the shortest text that reads back as it: a valid JSON number.
      fmt::format_to(out, "{{\"index\":{},\"label\":{},\"top\":[{}],\"prob\":[{}]}}\n", p.index[i], label,
                     fmt::join(top, top + k, ","), fmt::join(prob, prob + k, ","));
    } else {
      const std::string label = p.multi_label ? fmt::format("{}", fmt::join(p.present[i], " ")) : std::to_string(p.label[i]);
      fmt::format_to(out, "{},{},{},{}\n", p.index[i], label, fmt::join(top, top + k, ","),
                     fmt::join(prob, prob + k, ","));
    }
  }
  return fmt::to_string(b);
}

void write_predictions(const std::string& path, const Predictions& p, PredictFormat format) {
  write_file_atomic(path, format_predictions(p, format));
}

Predictions Predictor::run(int64_t top_k) {
  Predictions p;
  // Per batch: [b, 2 + 2k + W] double: id, label, top k ids, their probabilities, and for
  // multi-label data the W targets.
  std::vector<at::Tensor> rows;
  int64_t targets = 0;  // W
  const c10::Device device = evaluator_.device();
  evaluator_.forward_each(evaluator_.model(), [&](const data::Batch& batch, const at::Tensor& y,
                                                  const at::Tensor& logits) {  // the Evaluator's: argmax is top-1
    if (p.k == 0) {
      p.classes = logits.size(1);
      p.k = std::min(top_k, p.classes);
    }
    // Ranked by the logits as they are (bf16 under autocast): a stable descending sort keeps the
    // lower class id first among equal logits, the one argmax picks, so top[0] is exactly the
    // Evaluator's prediction. Probabilities in double (autocast leaves double alone).
    const at::Tensor top =
        std::get<1>(at::sort(logits, /*stable=*/true, /*dim=*/1, /*descending=*/true)).narrow(1, 0, p.k);
    const at::Tensor prob = evaluator_.loss().probabilities(logits.to(at::kDouble)).gather(1, top);
    const at::Tensor ids = at::tensor(batch.sample_ids, at::kLong).to(device).unsqueeze(1).to(at::kDouble);
    if (y.dim() == 2) {
      targets = y.size(1);
      rows.push_back(at::cat({ids, at::full_like(ids, -1), top.to(at::kDouble), prob, y.to(at::kDouble)}, 1));
    } else {
      rows.push_back(at::cat({ids, y.unsqueeze(1).to(at::kDouble), top.to(at::kDouble), prob}, 1));
    }
  });
  // No sample at all (an empty test set: the sampler gives every rank one when there is any).
  if (p.k == 0) p.k = top_k;
  // Every rank sees the same data, so the same W (a rank with no sample learns it from the pipeline).
  if (targets == 0) targets = evaluator_.loader().pipeline().target_width();
  p.multi_label = targets > 0;
  const int64_t width = 2 + 2 * p.k + targets;
  const at::Tensor local =
      rows.empty() ? at::zeros({0, width}, at::TensorOptions().dtype(at::kDouble).device(device)) : at::cat(rows);
  const train::SampleRows all = train::gather_sample_rows(local, evaluator_.comm());  // X2: padding dropped
  for (size_t i = 0; i < all.size(); ++i) {
    const double* row = all[i];
    p.index.push_back(static_cast<int64_t>(row[0]));
    p.label.push_back(static_cast<int64_t>(row[1]));
    if (p.multi_label) {
      std::vector<int64_t> present;
      for (int64_t c = 0; c < targets; ++c) {
        if (row[2 + 2 * p.k + c] > 0.5) present.push_back(c);
      }
      p.present.push_back(std::move(present));
    }
    for (int64_t j = 0; j < p.k; ++j) p.top.push_back(static_cast<int64_t>(row[2 + j]));
    p.prob.insert(p.prob.end(), row + 2 + p.k, row + 2 + 2 * p.k);
  }
  return p;
}

PredictSummary predict(const train::JobConfig& config, const PredictOptions& options) {
  const PredictFormat format = check_predict_options(options);  // bad usage fails before any work
  const bool config_weights = !config.model.init.empty() || nn::weights_in_model_file(config.model);
  const std::unique_ptr<train::Session> session = train::Session::open_inference(
      config, {"predict", options.checkpoint, config_weights,
               "give --checkpoint FILE, the run's run.dir/run.name, or weights in the config (model.init = "
               "\"weights.pt\", or model.name = \"torchscript\" or \"exported\" with model.path)",
               options.weights});
  train::Job& job = session->job();
  PredictSummary s;
  if (!session->checkpoint().empty()) {
    s.model = fmt::format("{} of step {} from {}", session->weight_set().what,
                          session->checkpoint_step(), session->checkpoint());
  } else if (nn::weights_in_model_file(config.model) && config.model.init.empty()) {
    s.model = fmt::format("{} {} as saved", config.model.name == "torchscript" ? "TorchScript module" : "exported program",
                          config.model.path);
  } else {
    s.model = fmt::format("{} with model.init weights from {}", config.model.name, config.model.init);
  }
  job.sync_bn_buffers();  // M2, as evaluation
  const auto t0 = std::chrono::steady_clock::now();
  if (job.detection != (format == PredictFormat::kCocoResults)) {
    throw bad_input("predict: --out {}: {}", options.out,
                    job.detection ? "a detector's predictions are COCO results: name a .json file"
                                  : "COCO results (.json) are a detector's; a classifier writes .jsonl or .csv");
  }
  if (job.detection) {
    // The evaluation's own pass and gather (X5), so the file's numbers are `crucible eval`'s.
    const train::EvalResult r = job.evaluator->run();
    const std::vector<data::CocoDetection>& d = job.evaluator->last_detections();
    if (job.main_rank()) write_file_atomic(options.out, format_coco_results(d));  // law 4, law 5
    s.out = options.out;
    s.samples = r.samples;
    s.detections = static_cast<int64_t>(d.size());
    s.coco = r.coco;
    s.step = session->checkpoint_step();
    log_info("predict: {} detections on {} images in {:.1f} s{}; COCO AP {:.4f} (AP50 {:.4f})", s.detections,
             s.samples, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             job.comm ? fmt::format(" over {} ranks", job.world.size) : std::string(), r.coco[0], r.coco[1]);
    return s;
  }
  const Predictions p = Predictor(*job.evaluator).run(options.top_k);
  if (p.classes > 0 && p.k < options.top_k) {
    log_info("predict: --top {} is more than the model's {} classes: each record lists all {}", options.top_k,
             p.classes, p.k);
  }
  if (job.main_rank()) write_predictions(options.out, p, format);  // law 4
  s.out = options.out;
  s.samples = p.size();
  s.k = p.k;
  s.classes = p.classes;
  s.step = session->checkpoint_step();
  s.top1_acc = p.top1_accuracy();
  s.topk_acc = p.topk_accuracy();
  log_info("predict: {} samples in {:.1f} s{}", s.samples,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           job.comm ? fmt::format(" over {} ranks", job.world.size) : std::string());
  return s;
}

}  // namespace crucible::commands
