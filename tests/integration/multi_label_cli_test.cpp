// Multi-label training end to end (loss.name = "binary_cross_entropy"): Fashion-MNIST tagged
// by NumPy with 13 tags — its class, and one of three groups (tops, footwear, other) — as
// [n, 13] 0/1 targets in .npy files. It trains (precision at 1 far above chance); `crucible
// eval`'s loss equals the binary cross-entropy recomputed here from `crucible predict`'s sigmoid
// probabilities of all 13 tags, its top-1 equals the file's; each record's label is the sample's
// tag set. Multi-label data with cross_entropy, and train/test targets of different widths,
// exit 2 naming the fix or both files.
// To add a case: write tags with write_tags(), run ml_run() with extra --set options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;

const std::string kFm = "/usr/share/datasets/fashion-mnist/";
constexpr int kTags = 13;

// train_x/test_x uint8 images, train_t/test_t [n, 13] uint8 tags; test_t12 has 12 columns.
void write_tags(const test::TempDir& d) {
  test::run_python("import gzip, numpy as np\n"
                   "r = '" + kFm + "'; d = '" + d.path() + "/'\n"
                   "def idx(name, offset, shape):\n"
                   "    return np.frombuffer(gzip.open(r + name).read()[offset:], np.uint8).reshape(shape)\n"
                   "group = np.array([10, 12, 10, 12, 10, 11, 10, 11, 12, 11])  # tops, footwear, other\n"
                   "def tags(y):\n"
                   "    t = np.zeros((len(y), 13), np.uint8)\n"
                   "    t[np.arange(len(y)), y] = 1; t[np.arange(len(y)), group[y]] = 1\n"
                   "    return t\n"
                   "x = idx('train-images-idx3-ubyte.gz', 16, (-1, 28, 28))[:4000]\n"
                   "y = idx('train-labels-idx1-ubyte.gz', 8, (-1,))[:4000]\n"
                   "tx = idx('t10k-images-idx3-ubyte.gz', 16, (-1, 28, 28))[:500]\n"
                   "ty = idx('t10k-labels-idx1-ubyte.gz', 8, (-1,))[:500]\n"
                   "np.save(d + 'train_x.npy', x); np.save(d + 'train_t.npy', tags(y))\n"
                   "np.save(d + 'test_x.npy', tx); np.save(d + 'test_t.npy', tags(ty))\n"
                   "np.save(d + 'test_t12.npy', tags(ty)[:, :12])\n");
}

std::vector<std::string> ml_run(const test::TempDir& d, const std::string& sub, std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), sub,
                                  "--set", "run.dir=" + d.path(),
                                  "--set", "run.name=ml",
                                  "--set", "data.dataset=arrays",
                                  "--set", "data.train_images=" + (d / "train_x.npy"),
                                  "--set", "data.train_labels=" + (d / "train_t.npy"),
                                  "--set", "data.test_images=" + (d / "test_x.npy"),
                                  "--set", "data.test_labels=" + (d / "test_t.npy"),
                                  "--set", "train.epochs=1",
                                  "--set", "train.max_steps=30",
                                  "--set", "train.batch_size=128",
                                  "--set", "train.precision=fp32",
                                  "--set", "train.channels_last=false",
                                  "--set", "loss.name=binary_cross_entropy",
                                  "--set", "checkpoint.every_steps=1000",
                                  "--set", "log.every_steps=10"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

TEST(MultiLabelCli, TagsTrainAndEvalLossEqualsTheBceOfPredictsProbabilities) {
  test::TempDir d;
  write_tags(d);
  auto train = test::run_command(ml_run(d, "train", {}));
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  expect_contains(train.out + train.err, {"13 classes, multi-label", "binary_cross_entropy"});
  const json summary = json::parse(test::read_text(d / "ml/summary.json"));
  // Precision at 1: chance is 2 of 13 tags; 30 steps learn far more.
  EXPECT_GT(summary["test_acc"].get<double>(), 0.6) << summary.dump();

  auto eval = test::run_command(ml_run(d, "eval", {"--json"}));
  ASSERT_EQ(eval.exit_code, 0) << eval.out << eval.err;
  const json e = json::parse(eval.out.substr(eval.out.rfind("\n{") + 1));
  auto pred = test::run_command(ml_run(d, "predict", {"--top", std::to_string(kTags), "--out", d / "p.jsonl"}));
  ASSERT_EQ(pred.exit_code, 0) << pred.out << pred.err;
  // The oracle for the tags: NumPy's rows, as index lists.
  std::istringstream want_rows(test::run_python(
      "import numpy as np\nt = np.load('" + (d / "test_t.npy") + "')\n"
      "print('\\n'.join(' '.join(str(c) for c in np.flatnonzero(r)) for r in t))\n"));
  std::istringstream lines(test::read_text(d / "p.jsonl"));
  double bce = 0, top1 = 0;
  int64_t n = 0;
  for (std::string line, row; std::getline(lines, line) && std::getline(want_rows, row); ++n) {
    const json j = json::parse(line);
    ASSERT_EQ(j["index"].get<int64_t>(), n);
    std::vector<int64_t> want;
    std::istringstream rs(row);
    for (int64_t c; rs >> c;) want.push_back(c);
    const auto label = j["label"].get<std::vector<int64_t>>();
    ASSERT_EQ(label, want) << "sample " << n;
    const auto top = j["top"].get<std::vector<int64_t>>();
    const auto prob = j["prob"].get<std::vector<double>>();
    ASSERT_EQ(top.size(), static_cast<size_t>(kTags));
    double sum = 0;
    for (size_t k = 0; k < top.size(); ++k) {
      const bool present = std::find(want.begin(), want.end(), top[k]) != want.end();
      bce -= (present ? std::log(prob[k]) : std::log(1.0 - prob[k])) / kTags;
      sum += prob[k];
    }
    top1 += std::find(want.begin(), want.end(), top[0]) != want.end() ? 1 : 0;
    EXPECT_GT(std::abs(sum - 1.0), 1e-3) << "sigmoids, not a softmax";
  }
  ASSERT_EQ(n, 500);
  std::printf("eval: loss %.9f top-1 %.6f; from predict's probabilities: BCE %.9f top-1 %.6f\n",
              e["test_loss"].get<double>(), e["test_acc"].get<double>(), bce / n, top1 / n);
  EXPECT_NEAR(e["test_loss"].get<double>(), bce / n, 1e-5);
  EXPECT_DOUBLE_EQ(e["test_acc"].get<double>(), top1 / n);
  EXPECT_DOUBLE_EQ(e["test_acc"].get<double>(), summary["test_acc"].get<double>());
}

TEST(MultiLabelCli, CrossEntropyOnTagsAndTargetsOfTwoWidthsExitTwo) {
  test::TempDir d;
  write_tags(d);
  auto ce = test::run_command(ml_run(d, "train", {"--set", "loss.name=cross_entropy"}));
  EXPECT_EQ(ce.exit_code, 2) << ce.out << ce.err;
  expect_contains(ce.err, {"cross_entropy", "multi-label", "loss.name = \"binary_cross_entropy\""});
  auto widths = test::run_command(ml_run(d, "train", {"--set", "data.test_labels=" + (d / "test_t12.npy")}));
  EXPECT_EQ(widths.exit_code, 2) << widths.out << widths.err;
  expect_contains(widths.err, {"train_t.npy", "13 classes", "test_t12.npy", "12 classes"});
}

}  // namespace
}  // namespace crucible
