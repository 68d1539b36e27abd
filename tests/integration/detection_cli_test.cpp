// `crucible train`, `eval` and `predict` on a detection set end to end (issue 48): FCOS over
// ResNet-18 on Fashion-MNIST articles pasted onto backgrounds (scripts/make-fashion-detection-set,
// small), at a small min_size so that a run takes seconds. The figures are checked against each
// other: the training's last evaluation, `crucible eval` and `crucible predict`'s COCO results
// file (with pycocotools where the oracle Python has it) give the same 12 numbers (X5); a resumed
// run ends on the uninterrupted run's weights; the step reads the host only for its vote (T6);
// the loss is the sum of the detector's terms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/train/schedule.h"
#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;

const char* const kStats[] = {"AP",  "AP50", "AP75",  "AP_small", "AP_medium", "AP_large",
                              "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large"};

// 48 training and 16 test images (sides 128-192 px, 1-4 articles each, category ids 1-4).
std::string make_set(const test::TempDir& dir) {
  const std::string out = dir / "set";
  const std::string cmd = fmt::format("{}/../../scripts/make-fashion-detection-set {} --train 48 --test 16 >/dev/null",
                                      CRUCIBLE_TEST_SUPPORT_DIR, out);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

// 48 images / batch 8 = 6 steps per epoch; 2 epochs.
std::vector<std::string> detection_run(const test::TempDir& dir, const std::string& set, const std::string& name,
                                       const std::string& command = "train") {
  return {test::crucible_binary(), command,
          "--set", "run.dir=" + dir.path(),
          "--set", "run.name=" + name,
          "--set", "data.dataset=detection",
          "--set", "data.train_path=" + set + "/annotations/instances_train.json",
          "--set", "data.test_path=" + set + "/annotations/instances_val.json",
          "--set", "data.detection_preset=hflip",
          "--set", "model.name=fcos_resnet18_fpn",
          "--set", "model.min_size=64",
          "--set", "model.max_size=96",
          "--set", "model.score_thresh=0.05",
          "--set", "optim.name=adamw",
          "--set", "optim.lr=0.001",
          "--set", "train.epochs=2",
          "--set", "train.batch_size=8",
          "--set", "train.precision=fp32",
          "--set", "checkpoint.every_steps=4",
          "--set", "log.every_steps=3",
          "--set", "log.progress=none"};
}

std::vector<std::string> with(std::vector<std::string> cmd, std::initializer_list<std::string> extra) {
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<json> records(const std::string& path, const std::string& type) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const json r = json::parse(line);
    if (r["type"] == type) out.push_back(r);
  }
  return out;
}

// The training's evaluations, `crucible eval` and `crucible predict` give the same 12 numbers;
// the predictions are a COCO results file (category ids of the file, xywh boxes, scores), whose
// pycocotools evaluation is the same again; summary.json carries the numbers and no accuracy;
// the training records carry the detector's loss terms, which sum to the loss; the step reads
// the host once (the vote), the log interval once more (T6).
TEST(DetectionCli, TrainEvalAndPredictGiveTheSameCocoNumbersT6X5) {
  test::TempDir dir;
  const std::string set = make_set(dir);
  const auto train = test::run_command(detection_run(dir, set, "det"));
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  test::expect_contains(train.out + train.err, {"fcos_resnet18_fpn (4 classes, min_size 64, max_size 96; trunk BatchNorm2d, 5 of 5",
                                    "loss: the detector's own loss dict"});
  const json s = json::parse(test::read_text(dir / "det/summary.json"));
  EXPECT_EQ(s["steps"], 12);
  EXPECT_TRUE(s["test_acc"].is_null());
  EXPECT_EQ(s["loss"], "detector");
  for (const char* k : kStats) {
    ASSERT_TRUE(s["test_" + std::string(k)].is_number()) << k;
    const double v = s["test_" + std::string(k)].get<double>();
    EXPECT_TRUE(v == -1.0 || (v >= 0.0 && v <= 1.0)) << k << " " << v;
  }
  EXPECT_EQ(s["host_reads"], json::parse(R"({"step_vote": 12, "interval": 4, "sync_bn_count": 0, "diagnosis": 0,
                                            "histogram": 0, "replicas": 0})"));

  const std::vector<json> trains = records(dir / "det/metrics.jsonl", "train");
  ASSERT_EQ(trains.size(), 4u);
  for (const json& r : trains) {
    EXPECT_FALSE(r.contains("acc"));
    double sum = 0;
    for (const char* t : {"loss_classification", "loss_bbox_regression", "loss_bbox_ctrness"}) {
      ASSERT_TRUE(r.contains(t)) << r.dump();
      const double v = r[t].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << t << " " << v;
      sum += v;
    }
    EXPECT_NEAR(r["loss"].get<double>(), sum, 1e-6 * sum) << r.dump();  // the terms are float32
  }
  const std::vector<json> evals = records(dir / "det/metrics.jsonl", "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals.back()["samples"], 16);
  for (const char* k : kStats) EXPECT_EQ(evals.back()["test_" + std::string(k)], s["test_" + std::string(k)]) << k;

  const auto eval = test::run_command(with(detection_run(dir, set, "det", "eval"), {"--json"}));
  ASSERT_EQ(eval.exit_code, 0) << eval.out << eval.err;
  test::expect_contains(eval.out + eval.err, {"COCO bbox", "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]"});
  const json e = json::parse(eval.out.substr(eval.out.rfind("\n{") + 1));
  for (const char* k : kStats) EXPECT_EQ(e["test_" + std::string(k)], s["test_" + std::string(k)]) << k;

  const std::string preds = dir / "predictions.json";
  const auto predict = test::run_command(with(detection_run(dir, set, "det", "predict"), {"--out", preds}));
  ASSERT_EQ(predict.exit_code, 0) << predict.out << predict.err;
  const json p = json::parse(test::read_text(preds));
  ASSERT_TRUE(p.is_array());
  ASSERT_GT(p.size(), 0u);
  std::set<int64_t> images;
  for (const json& d : p) {
    const int64_t c = d["category_id"].get<int64_t>();
    EXPECT_TRUE(c >= 1 && c <= 4) << d.dump();
    EXPECT_GE(d["bbox"][2].get<double>(), 0);
    EXPECT_GE(d["bbox"][3].get<double>(), 0);
    EXPECT_GE(d["score"].get<double>(), 0.05);
    images.insert(d["image_id"].get<int64_t>());
  }
  EXPECT_LE(images.size(), 16u);
  // The report's test images: the first 8 test images, each tile's true boxes the file's and its
  // detections the predictions file's for that image; the page carries the PNG inline.
  const std::string check = test::run_python("PNG = '" + (dir / "det/eval_images.png") + "'\nGT = '" + set +
                                             "/annotations/instances_val.json'\nRES = '" + preds + "'\nHTML = '" +
                                             (dir / "det/report.html") + "'\n" + R"(
import base64, json
from PIL import Image
tiles = json.loads(Image.open(PNG).text["crucible.eval_boxes"])
gt, res = json.load(open(GT)), json.load(open(RES))
ids = sorted(c["id"] for c in gt["categories"])
worst_truth = worst_det = 0.0
for t in tiles:
    truth = sorted([a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3], ids.index(a["category_id"])]
                   for a in gt["annotations"] if a["image_id"] == t["image_id"])
    mine = sorted(b[:5] for b in t["truth"])
    assert len(truth) == len(mine), (t["image_id"], truth, mine)
    worst_truth = max([worst_truth] + [abs(x - y) for p, q in zip(truth, mine) for x, y in zip(p, q)])
    dets = [r for r in res if r["image_id"] == t["image_id"]]
    assert len(dets) == len(t["detections"]), (t["image_id"], len(dets), len(t["detections"]))
    for r, d in zip(dets, t["detections"]):
        b = r["bbox"]
        assert ids[d[4]] == r["category_id"]
        worst_det = max([worst_det, abs(d[5] - r["score"])] + [abs(x - y) for x, y in zip(d[:4], [b[0], b[1], b[0] + b[2], b[1] + b[3]])])
inline = "data:image/png;base64," + base64.b64encode(open(PNG, "rb").read()).decode() in open(HTML).read()
print(len(tiles), worst_truth, worst_det, inline)
)");
  std::istringstream tiles_in(check);
  int tiles = 0;
  double worst_truth = 1, worst_det = 1;
  std::string inline_png;
  ASSERT_TRUE(tiles_in >> tiles >> worst_truth >> worst_det >> inline_png) << check;
  EXPECT_EQ(tiles, 8);
  EXPECT_LT(worst_truth, 1e-4);  // float32 boxes against the file's
  EXPECT_LT(worst_det, 1e-4);    // float32 against the results file's doubles
  EXPECT_EQ(inline_png, "True");

  // A classifier's extension for a detector is refused, naming what to write.
  const auto csv = test::run_command(with(detection_run(dir, set, "det", "predict"), {"--out", dir / "p.csv"}));
  EXPECT_EQ(csv.exit_code, 2);
  test::expect_contains(csv.out + csv.err, "a detector's predictions are COCO results: name a .json file");

  // pycocotools on the predictions file (the oracle Python of make test-torch2 has it).
  const std::string probe = test::run_python("try:\n import pycocotools; print('yes')\nexcept ImportError: print('no')\n");
  if (probe.find("yes") == std::string::npos) {
    if (test::oracles_required()) FAIL() << "pycocotools is missing from " << test::oracle_python();
    GTEST_SKIP() << "pycocotools is not in " << test::oracle_python() << "; make test-torch2 compares with it";
  }
  const std::string out = test::run_python("GT = '" + set + "/annotations/instances_val.json'\nRES = '" + preds + "'\n" + R"(
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
  for (const char* k : kStats) {
    double want = 0;
    ASSERT_TRUE(in >> want) << out;
    EXPECT_NEAR(e["test_" + std::string(k)].get<double>(), want, 1e-6) << k;
  }
}

// A detection run stopped inside its second epoch (train.max_steps) and run again resumes from
// its checkpoint and ends on the uninterrupted run's weights and numbers, bit for bit (law 1).
TEST(DetectionCli, AResumedRunEndsOnTheUninterruptedRunsWeights) {
  test::TempDir dir;
  const std::string set = make_set(dir);
  const auto whole = test::run_command(detection_run(dir, set, "whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto first = test::run_command(with(detection_run(dir, set, "split"), {"--set", "train.max_steps=8"}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto second = test::run_command(detection_run(dir, set, "split"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  test::expect_contains(second.out + second.err, "resumed from");
  const json a = json::parse(test::read_text(dir / "whole/summary.json"));
  const json b = json::parse(test::read_text(dir / "split/summary.json"));
  EXPECT_EQ(b["resumed_from_step"], 8);
  EXPECT_EQ(a["params_sha256"], b["params_sha256"]);
  for (const char* k : kStats) EXPECT_EQ(a["test_" + std::string(k)], b["test_" + std::string(k)]) << k;
}

// Two ranks (crucible launch) train a detector with train.multi_scale (M4): each step's
// shorter side is drawn from (seed, step), so both ranks train the same size at every step
// (CRUCIBLE_TEST_STEP_TRACE records each rank's), and the sizes are multi_scale_size()'s. The
// replicas agree at every checkpoint (the trainer compares them and fails the run otherwise). The
// evaluation runs on both ranks, 8 test images each, and its 12 numbers equal `crucible eval`'s
// in one process on the weights it ended on (X5).
TEST(DetectionCli, TwoRanksTrainTheSameMultiScaleSizesAndEvaluateAsOneProcessM4X5) {
  test::TempDir dir;
  const std::string set = make_set(dir);
  const std::vector<int64_t> sizes = {48, 64, 80};
  const std::vector<std::string> cmd =
      with(detection_run(dir, set, "two"), {"--set", "train.multi_scale=[48, 64, 80]", "--set", "train.batch_size=4"});
  ::setenv("CRUCIBLE_TEST_STEP_TRACE", (dir / "sizes").c_str(), 1);
  const auto two = test::run_command(test::launched(2, cmd));
  ::unsetenv("CRUCIBLE_TEST_STEP_TRACE");
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  test::expect_contains(two.out + two.err, {"multi-scale (M4): each step trains at a shorter side of one of 48, 64, 80 px",
                                            "evaluation at model.min_size = 64"});
  const auto r0 = test::read_step_trace(dir / "sizes", 0), r1 = test::read_step_trace(dir / "sizes", 1);
  ASSERT_EQ(r0.size(), 12u);  // 48 images over 2 ranks of 4: 6 steps an epoch, 2 epochs
  EXPECT_EQ(r0, r1) << "the ranks trained different sizes";
  std::set<int64_t> seen;
  for (size_t i = 0; i < r0.size(); ++i) {
    EXPECT_EQ(r0[i].first, static_cast<int64_t>(i));
    EXPECT_EQ(r0[i].second, train::multi_scale_size(0, r0[i].first, sizes)) << "step " << i;
    seen.insert(r0[i].second);
  }
  EXPECT_EQ(seen, std::set<int64_t>(sizes.begin(), sizes.end()));
  const json s = json::parse(test::read_text(dir / "two/summary.json"));
  EXPECT_EQ(s["steps"], 12);
  EXPECT_EQ(s["world_size"], 2);
  const std::vector<json> evals = records(dir / "two/metrics.jsonl", "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals.back()["samples"], 16);  // each test image once over the ranks

  const auto one = test::run_command(with(detection_run(dir, set, "two", "eval"), {"--json"}));
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const json e = json::parse(one.out.substr(one.out.rfind("\n{") + 1));
  for (const char* k : kStats) {
    ASSERT_TRUE(s["test_" + std::string(k)].is_number()) << k;
    EXPECT_EQ(e["test_" + std::string(k)], s["test_" + std::string(k)]) << k;
  }
  EXPECT_GE(s["test_AP"].get<double>(), 0.0);  // a number the images gave, not COCOeval's -1 for nothing to measure
}

// data.train_samples and data.test_samples take evenly spaced subsets of a detection set (they
// were refused as "holds no boxes"): 16 training images give 2 steps an epoch, 8 test images
// are evaluated, and `crucible eval` on the same subset gives the training's numbers.
TEST(DetectionCli, SubsetsOfADetectionSetTrainAndEvaluateOnTheirImages) {
  test::TempDir dir;
  const std::string set = make_set(dir);
  const auto cmd = with(detection_run(dir, set, "sub"), {"--set", "data.train_samples=16", "--set", "data.test_samples=8"});
  const auto train = test::run_command(cmd);
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  const json s = json::parse(test::read_text(dir / "sub/summary.json"));
  EXPECT_EQ(s["steps"], 4);
  const std::vector<json> evals = records(dir / "sub/metrics.jsonl", "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals.back()["samples"], 8);
  std::vector<std::string> eval_cmd = cmd;
  eval_cmd[1] = "eval";
  eval_cmd.push_back("--json");
  const auto eval = test::run_command(eval_cmd);
  ASSERT_EQ(eval.exit_code, 0) << eval.out << eval.err;
  const json e = json::parse(eval.out.substr(eval.out.rfind("\n{") + 1));
  for (const char* k : kStats) EXPECT_EQ(e["test_" + std::string(k)], s["test_" + std::string(k)]) << k;
}

// A detector needs boxes and a detection set needs a detector: both refused before training.
TEST(DetectionCli, ADetectorOnClassLabelsOrAClassifierOnBoxesIsRefused) {
  test::TempDir dir;
  const std::string set = make_set(dir);
  const auto classifier = test::run_command(with(detection_run(dir, set, "c"), {"--set", "model.name=resnet18"}));
  EXPECT_EQ(classifier.exit_code, 2);
  test::expect_contains(classifier.out + classifier.err, "data.dataset = \"detection\" needs a detector, and model.name = \"resnet18\"");
  const auto detector = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + dir.path(), "--set",
                                           "model.name=fcos_resnet18_fpn", "--set", "data.train_samples=64", "--set",
                                           "data.test_samples=64"});
  EXPECT_EQ(detector.exit_code, 2);
  test::expect_contains(detector.out + detector.err, "takes RGB images; the data have 1 channel(s)");
}

}  // namespace
}  // namespace crucible
