// The Evaluator against an oracle (X2, X5): a stub model returns fixed logits per sample, so
// top-1, top-5 and the mean loss over the test set can be computed independently here, over the
// whole table at once — torch.topk's choice among tied logits at the k-th place included. The
// figures are the same for every batch size (a last partial batch counted once per sample), and
// on 2 and 3 ranks (Gloo, every rank a thread) with the sampler's padding dropped by sample id.
#include "crucible/train/evaluator.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <tuple>
#include <memory>
#include <thread>
#include <vector>

#include "crucible/data/eval/coco_eval.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/loader/detection_pipeline.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/formats/source.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/launch.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/model.h"
#include "crucible/train/job_config.h"
#include "crucible/train/detection_eval.h"
#include "crucible/train/loss.h"
#include "coco_fixture.h"
#include "test_util.h"

namespace crucible::train {
namespace {

constexpr int64_t kSamples = 23;  // a prime: no batch size or rank count above 1 divides it

// Sample i is a 1×1 gray image of value i; the model answers row i of a fixed logits table.
class TableModel final : public nn::ModuleModel {
 public:
  explicit TableModel(at::Tensor table)
      : ModuleModel(std::make_shared<torch::nn::Module>()), table_(std::move(table)) {}
  at::Tensor forward(const at::Tensor& x) override {
    // DeviceInput hands over x = i / 255 (mean 0, std 1, 0–1 units).
    const at::Tensor ids = (x.reshape({x.size(0)}) * 255.0).round().to(at::kLong);
    return table_.index_select(0, ids);
  }
  nn::InputSpec input_spec() const override { return {}; }
  std::string describe() const override { return "logits table"; }

 private:
  at::Tensor table_;
};

struct Fixture {
  at::Tensor table;                  // [kSamples, classes] float logits
  std::vector<int64_t> labels;       // kSamples
};

// Smooth pseudo-random logits, and for 10 classes rows with ties: rows 0–9 all equal (every
// class tied, label = row), rows 10–12 tied at the 5th place (classes 4, 5 and 6 share the 5th
// largest logit; labels 4, 5, 6).
Fixture make_fixture(int64_t classes) {
  Fixture f;
  f.table = at::empty({kSamples, classes}, at::kFloat);
  auto t = f.table.accessor<float, 2>();
  for (int64_t i = 0; i < kSamples; ++i) {
    for (int64_t c = 0; c < classes; ++c) t[i][c] = static_cast<float>(3.0 * std::sin(7.3 * i + 1.9 * c + 0.4));
    f.labels.push_back((3 * i + 1) % classes);
  }
  if (classes == 10) {
    for (int64_t i = 0; i < 10; ++i) {
      for (int64_t c = 0; c < 10; ++c) t[i][c] = 0.0f;
      f.labels[static_cast<size_t>(i)] = i;
    }
    const float kth[10] = {9, 8, 7, 6, 5, 5, 5, 0, 0, 0};
    for (int64_t i = 10; i < 13; ++i) {
      for (int64_t c = 0; c < 10; ++c) t[i][c] = kth[c];
      f.labels[static_cast<size_t>(i)] = i - 6;  // 4, 5, 6
    }
  }
  return f;
}

struct Oracle {
  double acc = 0, top5 = 0, loss = 0;
  std::vector<bool> hit5;  // per sample
};

// Over the whole table at once, independent of batching, sharding and gathering: top-1 as
// argmax (the first of tied maxima), top-k (k = min(5, classes)) as torch.topk chooses, the
// loss by hand in double: logsumexp(row) - row[label], no label smoothing.
Oracle oracle(const Fixture& f) {
  Oracle o;
  const int64_t classes = f.table.size(1);
  const at::Tensor y = at::tensor(f.labels, at::kLong);
  o.acc = f.table.argmax(1).eq(y).sum().item<double>() / kSamples;
  const at::Tensor top = std::get<1>(f.table.topk(std::min<int64_t>(5, classes), 1, true, true));
  const at::Tensor hit = top.eq(y.unsqueeze(1)).any(1);
  o.top5 = hit.sum().item<double>() / kSamples;
  for (int64_t i = 0; i < kSamples; ++i) o.hit5.push_back(hit[i].item<bool>());
  auto t = f.table.accessor<float, 2>();
  double total = 0;
  for (int64_t i = 0; i < kSamples; ++i) {
    double m = -1e300, s = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, static_cast<double>(t[i][c]));
    for (int64_t c = 0; c < classes; ++c) s += std::exp(static_cast<double>(t[i][c]) - m);
    total += m + std::log(s) - t[i][f.labels[static_cast<size_t>(i)]];
  }
  o.loss = total / kSamples;
  return o;
}

// The Evaluator over the fixture with `batch` samples per batch, as rank `rank` of `ranks`.
EvalResult evaluate(const Fixture& f, int64_t batch, distributed::Comm* comm = nullptr, int rank = 0, int ranks = 1) {
  const data::ImageSpec spec{1, 1, 1, data::ColorOrder::kGray, data::ValueRange::kByte};
  std::vector<uint8_t> pixels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) pixels[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  auto source = std::make_shared<data::InMemorySource>(spec, pixels, f.labels, "logits fixture");
  auto pipeline = std::make_shared<data::ArrayPipeline>(source, data::SampleTransforms{}, 0);
  data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.threads = 1;
  // As the Trainer shards the test set: in order, padded (X2).
  data::Loader loader(pipeline, data::DistributedSampler(kSamples, false, 0, {ranks, rank, false}), lo);
  const data::DeviceInput input(spec, {{0.0}, {1.0}, data::ValueRange::kUnit}, c10::kCPU, false);
  TableModel model(f.table);
  LossSection ls;  // cross_entropy with label smoothing 0.1 for training; evaluation reports without
  const std::unique_ptr<Loss> loss = make_loss({ls, f.table.size(1), c10::kCPU});
  Evaluator ev(model, loader, input, *loss, Precision{}, c10::kCPU, comm);
  return ev.run();
}

// X5: top-1, top-5 and loss equal the oracle's, ties at the 5th place included.
TEST(Evaluator, TopOneTopFiveAndLossEqualAnOracleX5) {
  const Fixture f = make_fixture(10);
  const Oracle want = oracle(f);
  // The tie rows decide between rules: "fewer than 5 classes score higher" would count rows
  // 10–12 (and 0–9) all as hits, "the lowest indices win" rows 0–4; torch.topk does neither.
  int tie_hits = 0, tie_misses = 0;
  for (int64_t i = 0; i < 13; ++i) (want.hit5[static_cast<size_t>(i)] ? tie_hits : tie_misses)++;
  EXPECT_GT(tie_hits, 0);
  EXPECT_GT(tie_misses, 0);
  int kth_hits = 0;
  for (int64_t i = 10; i < 13; ++i) kth_hits += want.hit5[static_cast<size_t>(i)] ? 1 : 0;
  EXPECT_EQ(kth_hits, 1) << "classes 4, 5, 6 tie for the 5th place: torch.topk keeps one of them";
  // Rows without ties: by hand, a hit when fewer than 5 classes score higher than the label.
  auto t = f.table.accessor<float, 2>();
  for (int64_t i = 13; i < kSamples; ++i) {
    int higher = 0;
    for (int64_t c = 0; c < 10; ++c) higher += t[i][c] > t[i][f.labels[static_cast<size_t>(i)]] ? 1 : 0;
    EXPECT_EQ(want.hit5[static_cast<size_t>(i)], higher < 5) << "row " << i;
  }
  const EvalResult r = evaluate(f, 4);
  std::printf("oracle: top-1 %.6f top-5 %.6f loss %.9f; evaluator: top-1 %.6f top-5 %.6f loss %.9f\n", want.acc,
              want.top5, want.loss, r.acc, r.top5, r.loss);
  EXPECT_EQ(r.samples, kSamples);
  EXPECT_DOUBLE_EQ(r.acc, want.acc);
  EXPECT_DOUBLE_EQ(r.top5, want.top5);
  EXPECT_NEAR(r.loss, want.loss, 1e-6);  // float logits, per-sample cross entropy in float
  EXPECT_LT(r.acc, r.top5);
  EXPECT_LT(r.top5, 1.0);
}

// k = min(5, classes): with 3 classes every label is in the top 3.
TEST(Evaluator, TopFiveOfThreeClassesIsTopThreeX5) {
  const Fixture f = make_fixture(3);
  const Oracle want = oracle(f);
  const EvalResult r = evaluate(f, 5);
  EXPECT_EQ(r.top5, 1.0);
  EXPECT_DOUBLE_EQ(r.acc, want.acc);
  EXPECT_NEAR(r.loss, want.loss, 1e-6);
}

// X2: a test set that no batch size divides: every sample counted once, whatever the batch.
TEST(Evaluator, EverySampleCountsOnceWhenTheBatchDoesNotDivideTheSetX2) {
  const Fixture f = make_fixture(10);
  const Oracle want = oracle(f);
  const EvalResult one = evaluate(f, 1);
  for (int64_t batch : {1, 2, 4, 5, 7, 22, 23, 64}) {
    const EvalResult r = evaluate(f, batch);
    EXPECT_EQ(r.samples, kSamples) << "batch " << batch;
    EXPECT_DOUBLE_EQ(r.acc, want.acc) << "batch " << batch;
    EXPECT_DOUBLE_EQ(r.top5, want.top5) << "batch " << batch;
    EXPECT_NEAR(r.loss, want.loss, 1e-6) << "batch " << batch;
    EXPECT_NEAR(r.loss, one.loss, 1e-12) << "batch " << batch;  // the same per-sample values, summed in id order
  }
}

// Runs body(rank, comm) on `size` threads joined in one Gloo process group.
void with_ranks(int size, const std::function<void(int, distributed::Comm&)>& body) {
  const int port = distributed::free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        distributed::World w;
        w.rank = r;
        w.size = size;
        w.local_rank = r;
        w.local_size = size;
        w.master_port = port;
        distributed::CommOptions o;
        o.timeout_s = 60;
        o.heartbeat_s = 0.5;
        auto comm = distributed::Comm::connect(w, c10::Device(c10::kCPU), o);
        body(r, *comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// X2/X5: on 2 and 3 ranks (23 samples: each pads its shard by 1, with sample 0 — a top-1 hit
// whose loss, ln 10, is not the mean) every rank reports exactly the single-process figures.
TEST(Evaluator, RanksGiveTheSingleProcessFiguresWithThePaddingDroppedX2) {
  const Fixture f = make_fixture(10);
  const EvalResult single = evaluate(f, 4);
  for (int ranks : {2, 3}) {
    std::vector<EvalResult> got(static_cast<size_t>(ranks));
    with_ranks(ranks, [&](int rank, distributed::Comm& comm) {
      got[static_cast<size_t>(rank)] = evaluate(f, 4, &comm, rank, ranks);
    });
    for (int rank = 0; rank < ranks; ++rank) {
      const EvalResult& r = got[static_cast<size_t>(rank)];
      const std::string where = "rank " + std::to_string(rank) + " of " + std::to_string(ranks);
      EXPECT_EQ(r.samples, kSamples) << where;
      EXPECT_EQ(r.acc, single.acc) << where;
      EXPECT_EQ(r.top5, single.top5) << where;
      EXPECT_NEAR(r.loss, single.loss, 1e-12) << where;
    }
  }
}

// Multi-label data: sample i is a 1×1 gray image of value i with the targets of row i.
class TargetSource final : public data::Source {
 public:
  explicit TargetSource(std::vector<float> targets, int64_t width) : targets_(std::move(targets)), width_(width) {
    for (int64_t i = 0; i < kSamples; ++i) pixels_.push_back(static_cast<uint8_t>(i));
  }
  int64_t size() const override { return kSamples; }
  data::ImageSpec spec() const override { return {1, 1, 1, data::ColorOrder::kGray, data::ValueRange::kByte}; }
  const uint8_t* pixels(int64_t i) const override { return pixels_.data() + i; }
  int64_t label(int64_t) const override { return -1; }
  int64_t num_classes() const override { return width_; }
  std::string describe() const override { return "multi-label fixture"; }
  int64_t target_width() const override { return width_; }
  const float* targets(int64_t i) const override { return targets_.data() + i * width_; }

 private:
  std::vector<uint8_t> pixels_;
  std::vector<float> targets_;
  int64_t width_;
};

// Multi-label (binary_cross_entropy): top-1 is "the top class is present" (precision at 1),
// top-5 "a present class among torch.topk's 5", the loss the class-mean binary cross-entropy;
// each against a by-hand oracle in double, for several batch sizes and on 3 ranks.
TEST(Evaluator, MultiLabelFiguresEqualAnOracle) {
  const Fixture f = make_fixture(10);
  const int64_t w = 10;
  std::vector<float> targets(static_cast<size_t>(kSamples * w));
  for (int64_t i = 0; i < kSamples; ++i) {
    for (int64_t c = 0; c < w; ++c) targets[static_cast<size_t>(i * w + c)] = (i * 7 + c * 3) % 5 < 2 ? 1.0f : 0.0f;
  }
  auto t = f.table.accessor<float, 2>();
  double hits = 0, hits5 = 0, loss = 0;
  const at::Tensor top = std::get<1>(f.table.topk(5, 1, true, true));
  for (int64_t i = 0; i < kSamples; ++i) {
    const float* row = targets.data() + i * w;
    hits += row[f.table[i].argmax().item<int64_t>()];
    bool any = false;
    for (int64_t j = 0; j < 5; ++j) any = any || row[top[i][j].item<int64_t>()] > 0.5f;
    hits5 += any ? 1 : 0;
    double l = 0;
    for (int64_t c = 0; c < w; ++c) {
      const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(t[i][c])));
      l -= row[c] > 0.5f ? std::log(p) : std::log(1.0 - p);
    }
    loss += l / static_cast<double>(w);
  }
  auto source = std::make_shared<TargetSource>(targets, w);
  auto run = [&](int64_t batch, distributed::Comm* comm, int rank, int ranks) {
    auto pipeline = std::make_shared<data::ArrayPipeline>(source, data::SampleTransforms{}, 0);
    data::LoaderOptions lo;
    lo.batch_size = batch;
    lo.threads = 1;
    data::Loader loader(pipeline, data::DistributedSampler(kSamples, false, 0, {ranks, rank, false}), lo);
    const data::DeviceInput input(source->spec(), {{0.0}, {1.0}, data::ValueRange::kUnit}, c10::kCPU, false);
    TableModel model(f.table);
    LossSection ls;
    ls.name = "binary_cross_entropy";
    const std::unique_ptr<Loss> bce = make_loss({ls, w, c10::kCPU, true});
    return Evaluator(model, loader, input, *bce, Precision{}, c10::kCPU, comm).run();
  };
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, hits5);
  for (int64_t batch : {1, 4, 23}) {
    const EvalResult r = run(batch, nullptr, 0, 1);
    EXPECT_EQ(r.samples, kSamples);
    EXPECT_DOUBLE_EQ(r.acc, hits / kSamples) << "batch " << batch;
    EXPECT_DOUBLE_EQ(r.top5, hits5 / kSamples) << "batch " << batch;
    EXPECT_NEAR(r.loss, loss / kSamples, 1e-6) << "batch " << batch;
  }
  std::vector<EvalResult> got(3);
  with_ranks(3, [&](int rank, distributed::Comm& comm) { got[static_cast<size_t>(rank)] = run(4, &comm, rank, 3); });
  for (const EvalResult& r : got) {
    EXPECT_EQ(r.samples, kSamples);
    EXPECT_DOUBLE_EQ(r.acc, hits / kSamples);
    EXPECT_DOUBLE_EQ(r.top5, hits5 / kSamples);
  }
}

}  // namespace
}  // namespace crucible::train

namespace crucible::train {
namespace {

// ---- detection: COCO's numbers over ranks (X5) ----------------------------------------------

// 9 images (no rank count above 1 divides it: the sampler pads), 40–70 px, 0–3 boxes each in the
// fixture's categories 7, 1, 3; one image without boxes.
std::string detection_set(const test::TempDir& dir) {
  std::vector<std::tuple<int64_t, int, int>> images;
  nlohmann::json anns = nlohmann::json::array();
  std::mt19937 gen(48);
  for (int64_t i = 0; i < 9; ++i) {
    const int w = 40 + static_cast<int>(gen() % 30), h = 40 + static_cast<int>(gen() % 30);
    images.emplace_back(300 + 11 * i, w, h);
    for (int k = 0; k < static_cast<int>(i % 4); ++k) {
      anns.push_back(test::ann(i * 10 + k + 1, 300 + 11 * i, std::vector<int>{7, 1, 3}[k % 3],
                               {2.0 + 3 * k, 1.0 + 2 * k, w / 2.5, h / 3.0}));
    }
  }
  return test::write_coco(dir, images, anns);
}

std::unique_ptr<nn::Detector> small_fcos() {
  nn::DetectorOptions o;
  o.num_classes = 3;
  o.min_size = 64;
  o.max_size = 96;
  o.score_thresh = 0.05;  // a model at its initialisation scores about 0.07
  o.detections_per_img = 20;
  at::manual_seed(7);
  return nn::make_fcos(18, o);
}

DetectionEval evaluate_set(nn::Detector& detector, const std::string& coco, distributed::Comm* comm, int rank,
                           int ranks) {
  data::DetectionPipelineOptions po;
  po.preset = "test";
  auto pipeline = std::make_shared<data::DetectionPipeline>(data::open_coco(coco, {}), po);
  data::LoaderOptions lo;
  lo.batch_size = 2;
  lo.threads = 1;
  data::Loader loader(pipeline, data::DistributedSampler(pipeline->size(), false, 0, {ranks, rank, false}), lo);
  return evaluate_detections(detector, loader, data::read_coco_ground_truth(coco), c10::kCPU, comm);
}

bool same(const std::vector<data::CocoDetection>& a, const std::vector<data::CocoDetection>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].image_id != b[i].image_id || a[i].category_id != b[i].category_id || a[i].score != b[i].score ||
        !std::equal(a[i].bbox, a[i].bbox + 4, b[i].bbox)) {
      return false;
    }
  }
  return true;
}

// X5: on 2 and 3 ranks every rank gets the one-process detections, bit for bit, and the same 12
// numbers; every image once (the padding's second evaluation dropped); the categories are the
// file's ids; with pycocotools in the oracle Python (make test-torch2), its COCOeval on the same
// results file gives the same numbers.
TEST(DetectionEval, RanksGiveTheOneProcessDetectionsAndNumbersX5) {
  test::TempDir dir;
  const std::string coco = detection_set(dir);
  std::unique_ptr<nn::Detector> one_model = small_fcos();
  const DetectionEval one = evaluate_set(*one_model, coco, nullptr, 0, 1);
  EXPECT_EQ(one.images, 9);
  ASSERT_GT(one.results.size(), 20u);
  std::set<int64_t> categories, images;
  for (const auto& d : one.results) {
    categories.insert(d.category_id);
    images.insert(d.image_id);
    EXPECT_GE(d.bbox[2], 0);
    EXPECT_GE(d.bbox[3], 0);
  }
  for (int64_t c : categories) EXPECT_TRUE(c == 7 || c == 1 || c == 3) << c;
  EXPECT_GT(images.size(), 5u);
  for (int ranks : {2, 3}) {
    std::vector<std::unique_ptr<nn::Detector>> models;
    for (int r = 0; r < ranks; ++r) models.push_back(small_fcos());
    std::vector<DetectionEval> got(static_cast<size_t>(ranks));
    with_ranks(ranks, [&](int rank, distributed::Comm& comm) {
      got[static_cast<size_t>(rank)] = evaluate_set(*models[static_cast<size_t>(rank)], coco, &comm, rank, ranks);
    });
    for (int rank = 0; rank < ranks; ++rank) {
      const DetectionEval& g = got[static_cast<size_t>(rank)];
      const std::string where = "rank " + std::to_string(rank) + " of " + std::to_string(ranks);
      EXPECT_EQ(g.images, 9) << where;
      EXPECT_TRUE(same(g.results, one.results)) << where << ": " << g.results.size() << " detections, one process "
                                                << one.results.size();
      EXPECT_EQ(g.coco.stats, one.coco.stats) << where;
    }
  }
  // pycocotools on the same results (the oracle Python of make test-torch2 has it).
  const std::string probe = test::run_python("try:\n import pycocotools; print('yes')\nexcept ImportError: print('no')\n");
  if (probe.find("yes") == std::string::npos) {
    if (test::oracles_required()) FAIL() << "pycocotools is missing from " << test::oracle_python();
    GTEST_SKIP() << "pycocotools is not in " << test::oracle_python() << "; make test-torch2 compares with it";
  }
  nlohmann::json results = nlohmann::json::array();
  for (const auto& d : one.results) {
    results.push_back({{"image_id", d.image_id}, {"category_id", d.category_id},
                       {"bbox", {d.bbox[0], d.bbox[1], d.bbox[2], d.bbox[3]}}, {"score", d.score}});
  }
  std::ofstream(dir / "results.json") << results.dump();
  // The script's first line tells scripts/audit-deps that pycocotools comes from the venv's oracles.
  const std::string out = test::run_python("GT = '" + coco + "'\nRES = '" + (dir / "results.json") + "'\n" + R"(
# audit-deps: python .venv-torch2
import contextlib, io
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
with contextlib.redirect_stdout(io.StringIO()):
    gt = COCO(GT); dt = gt.loadRes(RES)
    e = COCOeval(gt, dt, 'bbox'); e.evaluate(); e.accumulate(); e.summarize()
print(' '.join(repr(float(s)) for s in e.stats))
)");
  std::istringstream in(out);
  for (size_t i = 0; i < 12; ++i) {
    double want = 0;
    ASSERT_TRUE(in >> want) << out;
    EXPECT_NEAR(one.coco.stats[i], want, 1e-12) << "stat " << i;
  }
}

}  // namespace
}  // namespace crucible::train
