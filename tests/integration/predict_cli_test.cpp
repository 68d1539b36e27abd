// `crucible predict` end to end on a tiny Fashion-MNIST run (2000 training samples, 8 fp32
// steps; 501 test samples, so that 2 ranks need one sample of padding): the file's top-1 equals
// `crucible eval`'s accuracy exactly, records are in sample order with descending probabilities
// that sum to 1; the probabilities equal softmax of the logits of python3-torch's own forward of
// the checkpoint (oracle); .csv holds the .jsonl values; 2 ranks write the very file 1 process
// writes; bad usage exits 2 and writes nothing.
// To add a case: run predict() with extra arguments and read the file with read_jsonl/read_csv.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_contains;

constexpr int64_t kTestSamples = 501;
constexpr const char* kRun = "p";

struct Record {
  int64_t index = -1, label = -1;
  std::vector<int64_t> top;
  std::vector<double> prob;
  bool operator==(const Record& o) const {
    return index == o.index && label == o.label && top == o.top && prob == o.prob;
  }
};

std::vector<Record> read_jsonl(const std::string& path) {
  std::vector<Record> out;
  std::istringstream lines(test::read_text(path));
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    EXPECT_EQ(j.size(), 4u) << line;
    out.push_back({j.at("index").get<int64_t>(), j.at("label").get<int64_t>(), j.at("top").get<std::vector<int64_t>>(),
                   j.at("prob").get<std::vector<double>>()});
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::istringstream in(s);
  for (std::string p; std::getline(in, p, sep);) parts.push_back(p);
  return parts;
}

// index,label,top1..topK,prob1..probK
std::vector<Record> read_csv(const std::string& path, int64_t k) {
  std::istringstream lines(test::read_text(path));
  std::string header;
  std::getline(lines, header);
  std::string want = "index,label";
  for (int64_t j = 1; j <= k; ++j) want += ",top" + std::to_string(j);
  for (int64_t j = 1; j <= k; ++j) want += ",prob" + std::to_string(j);
  EXPECT_EQ(header, want);
  std::vector<Record> out;
  for (std::string line; std::getline(lines, line);) {
    const auto f = split(line, ',');
    EXPECT_EQ(f.size(), static_cast<size_t>(2 + 2 * k)) << line;
    if (f.size() != static_cast<size_t>(2 + 2 * k)) break;
    Record r{std::stoll(f[0]), std::stoll(f[1]), {}, {}};
    for (int64_t j = 0; j < k; ++j) r.top.push_back(std::stoll(f[2 + j]));
    for (int64_t j = 0; j < k; ++j) r.prob.push_back(std::strtod(f[2 + k + j].c_str(), nullptr));
    out.push_back(r);
  }
  return out;
}

// One tiny run shared by the cases of a test process (each test runs in its own process under
// ctest, so each trains it once: about 8 s).
class PredictCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    train_ = new test::CommandResult(test::run_command(
        {test::crucible_binary(), "train", "--set", "run.dir=" + dir_->path(), "--set", std::string("run.name=") + kRun,
         "--set", "data.train_samples=2000", "--set", "data.test_samples=" + std::to_string(kTestSamples),
         "--set", "train.epochs=1", "--set", "train.max_steps=8", "--set", "train.precision=fp32",
         "--set", "train.channels_last=false", "--set", "log.progress=lines", "--set", "checkpoint.every_steps=1000"}));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete dir_;
  }
  void SetUp() override { ASSERT_EQ(train_->exit_code, 0) << train_->out << train_->err; }

  static std::vector<std::string> job_args(const std::string& sub) {
    return {test::crucible_binary(), sub, "--set", "run.dir=" + dir_->path(), "--set", std::string("run.name=") + kRun,
            "--set", "data.test_samples=" + std::to_string(kTestSamples)};
  }
  static std::vector<std::string> predict(std::initializer_list<std::string> extra) {
    std::vector<std::string> cmd = job_args("predict");
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return cmd;
  }
  static std::string path(const std::string& name) { return *dir_ / name; }
  static std::string checkpoint() { return path(std::string(kRun) + "/checkpoints/ckpt-000000008.safetensors"); }

  static test::TempDir* dir_;
  static test::CommandResult* train_;
};
test::TempDir* PredictCli::dir_ = nullptr;
test::CommandResult* PredictCli::train_ = nullptr;

TEST_F(PredictCli, TopOneEqualsEvalAccuracyAndRecordsAreInSampleOrder) {
  std::vector<std::string> eval = job_args("eval");
  eval.push_back("--json");
  const auto e = test::run_command(eval);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const json ej = json::parse(e.out.substr(e.out.rfind("\n{") + 1));
  const double eval_acc = ej["test_acc"].get<double>();

  // --top 20 is more than the 10 classes: every record lists all 10, and the log says so.
  const auto all = test::run_command(predict({"--top", "20", "--out", path("all.jsonl")}));
  ASSERT_EQ(all.exit_code, 0) << all.err;
  expect_contains(all.out, "--top 20 is more than the model's 10 classes");
  const auto rec = read_jsonl(path("all.jsonl"));
  ASSERT_EQ(rec.size(), static_cast<size_t>(kTestSamples));
  int64_t hits = 0, bad_order = 0, bad_range = 0;
  double worst_sum = 0;
  for (size_t i = 0; i < rec.size(); ++i) {
    const Record& r = rec[i];
    EXPECT_EQ(r.index, static_cast<int64_t>(i));
    ASSERT_EQ(r.top.size(), 10u);
    ASSERT_EQ(r.prob.size(), 10u);
    std::vector<int64_t> classes = r.top;
    std::sort(classes.begin(), classes.end());
    EXPECT_EQ(classes, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "sample " << i;
    EXPECT_TRUE(r.label >= 0 && r.label < 10) << r.label;
    hits += r.top[0] == r.label;
    double sum = 0;
    for (size_t j = 0; j < r.prob.size(); ++j) {
      bad_range += !(r.prob[j] > 0 && r.prob[j] <= 1);
      bad_order += j > 0 && r.prob[j] > r.prob[j - 1];
      sum += r.prob[j];
    }
    worst_sum = std::max(worst_sum, std::abs(sum - 1));
  }
  const double acc = static_cast<double>(hits) / static_cast<double>(rec.size());
  std::printf("top-1 over the file %.17g, crucible eval %.17g; worst |sum of probabilities - 1| %.3g\n", acc, eval_acc,
              worst_sum);
  EXPECT_EQ(acc, eval_acc);
  EXPECT_EQ(bad_order, 0);
  EXPECT_EQ(bad_range, 0);
  EXPECT_LT(worst_sum, 1e-5);
  char line[160];
  std::snprintf(line, sizeof(line), "predict: %lld samples, top-1 %.2f%%, top-10 100.00%%",
                static_cast<long long>(kTestSamples), 100 * acc);
  expect_contains(all.out, line);
  expect_contains(all.out, "→ " + path("all.jsonl"));

  // The default K = 5: the first 5 of the same ranking; the top-5 accuracy is over the file.
  const auto five = test::run_command(predict({"--out", path("five.jsonl"), "--checkpoint", checkpoint()}));
  ASSERT_EQ(five.exit_code, 0) << five.err;
  const auto rec5 = read_jsonl(path("five.jsonl"));
  ASSERT_EQ(rec5.size(), rec.size());
  int64_t hits5 = 0;
  for (size_t i = 0; i < rec.size(); ++i) {
    EXPECT_EQ(rec5[i].index, rec[i].index);
    EXPECT_EQ(rec5[i].label, rec[i].label);
    EXPECT_EQ(rec5[i].top, std::vector<int64_t>(rec[i].top.begin(), rec[i].top.begin() + 5)) << "sample " << i;
    EXPECT_EQ(rec5[i].prob, std::vector<double>(rec[i].prob.begin(), rec[i].prob.begin() + 5)) << "sample " << i;
    hits5 += std::count(rec5[i].top.begin(), rec5[i].top.end(), rec5[i].label);
  }
  std::snprintf(line, sizeof(line), "top-5 %.2f%%", 100.0 * static_cast<double>(hits5) / rec5.size());
  expect_contains(five.out, line);

  // A runtime failure (the folder does not exist) exits 1 and leaves nothing behind.
  const auto nowhere = test::run_command(predict({"--out", path("no_such_folder/x.jsonl")}));
  EXPECT_EQ(nowhere.exit_code, 1) << nowhere.err;
  EXPECT_FALSE(fs::exists(path("no_such_folder")));
}

// Oracle: python3-torch runs the checkpoint's weights through its own copy of the model
// (bench/fmnist_baseline.py's FmnistCnn, in float64) on the same 501 test images, normalised
// as the config says; crucible's probabilities must be softmax of those logits for the classes
// it lists, and its ranking must be the oracle's wherever the logits are not within 1e-4.
TEST_F(PredictCli, ProbabilitiesAreSoftmaxOfPytorchsLogits) {
  const auto r = test::run_command(predict({"--top", "3", "--out", path("three.jsonl")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string out = test::run_python(
      "import gzip, json, struct, numpy as np, torch, torch.nn as nn, torch.nn.functional as F\n"
      "class FmnistCnn(nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False); self.bn1 = nn.BatchNorm2d(32)\n"
      "        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False); self.bn2 = nn.BatchNorm2d(32)\n"
      "        self.conv3 = nn.Conv2d(32, 64, 3, padding=1, bias=False); self.bn3 = nn.BatchNorm2d(64)\n"
      "        self.conv4 = nn.Conv2d(64, 64, 3, padding=1, bias=False); self.bn4 = nn.BatchNorm2d(64)\n"
      "        self.fc1 = nn.Linear(3136, 256); self.fc2 = nn.Linear(256, 10)\n"
      "    def forward(self, x):\n"
      "        x = F.relu(self.bn1(self.conv1(x))); x = F.relu(self.bn2(self.conv2(x))); x = F.max_pool2d(x, 2)\n"
      "        x = F.relu(self.bn3(self.conv3(x))); x = F.relu(self.bn4(self.conv4(x))); x = F.max_pool2d(x, 2)\n"
      "        return self.fc2(F.relu(self.fc1(x.flatten(1))))\n"
      "b = open('" + checkpoint() + "', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])\n"
      "dt = {'F32': np.float32, 'F64': np.float64, 'I64': np.int64}\n"
      "sd = {k[6:]: torch.from_numpy(np.frombuffer(b[8+n+v['data_offsets'][0]:8+n+v['data_offsets'][1]],\n"
      "      dt[v['dtype']]).reshape(v['shape']).copy()) for k, v in h.items() if k.startswith('model.')}\n"
      "m = FmnistCnn(); m.load_state_dict(sd); m = m.double().eval()\n"
      "img = np.frombuffer(gzip.open('/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz').read()[16:],\n"
      "      np.uint8).reshape(-1, 1, 28, 28)[:" + std::to_string(kTestSamples) + "]\n"
      "x = (torch.from_numpy(img.astype(np.float64)) / 255 - 0.2860) / 0.3530\n"
      "with torch.no_grad(): logits = m(x)\n"
      "p = torch.softmax(logits, 1)\n"
      "recs = [json.loads(l) for l in open('" + path("three.jsonl") + "')]\n"
      "diff = max(abs(p[r['index'], c].item() - q) for r in recs for c, q in zip(r['top'], r['prob']))\n"
      "srt = torch.sort(logits, 1, descending=True)\n"
      "clear = [i for i in range(len(recs)) if (srt.values[i, :3] - srt.values[i, 1:4]).abs().min() > 1e-4]\n"
      "wrong = sum(recs[i]['top'] != srt.indices[i, :3].tolist() for i in clear)\n"
      "print(json.dumps({'n': len(recs), 'diff': diff, 'clear': len(clear), 'wrong': wrong}))\n");
  const json o = json::parse(out);
  std::printf("oracle: %s\n", o.dump().c_str());
  EXPECT_EQ(o["n"], kTestSamples);
  EXPECT_LT(o["diff"].get<double>(), 1e-6);  // float32 logits against float64 ones
  EXPECT_GT(o["clear"].get<int64_t>(), kTestSamples * 9 / 10);
  EXPECT_EQ(o["wrong"], 0);
}

TEST_F(PredictCli, CsvHoldsTheJsonlValues) {
  for (const char* k : {"1", "4"}) {
    const auto j = test::run_command(predict({"--top", k, "--out", path("v.jsonl")}));
    ASSERT_EQ(j.exit_code, 0) << j.err;
    const auto c = test::run_command(predict({"--top", k, "--out", path("v.csv")}));
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const auto from_jsonl = read_jsonl(path("v.jsonl"));
    const auto from_csv = read_csv(path("v.csv"), std::stoll(k));
    ASSERT_EQ(from_jsonl.size(), static_cast<size_t>(kTestSamples));
    EXPECT_TRUE(from_csv == from_jsonl) << "K = " << k;
    EXPECT_EQ(from_csv.front().top.size(), static_cast<size_t>(std::stoll(k)));
  }
}

// X2: the test set sharded over 2 ranks (501 samples: rank 1 reads sample 0 again as padding),
// the rows gathered and the padding dropped: rank 0 writes byte for byte what 1 process writes,
// and only rank 0 speaks. One sample per forward on both sides: oneDNN picks its kernels by
// batch size, so a sample's last bits may depend on the batch it sits in (an AVX512 Xeon showed
// it; the thread count changes nothing), and shards make other batches.
TEST_F(PredictCli, TwoRanksWriteTheFileOneProcessWrites) {
  fs::create_directories(path("dist"));
  const auto one = test::run_command(predict({"--top", "10", "--set", "train.eval_batch_size=1", "--set",
                                              "train.threads=1", "--out", path("dist/one.jsonl")}));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  std::vector<std::string> two = {test::crucible_binary(), "launch", "--nproc", "2", "--"};
  for (const auto& a : predict({"--top", "10", "--set", "train.eval_batch_size=1", "--set", "train.threads=1", "--out",
                                path("dist/two.jsonl")})) {
    two.push_back(a);
  }
  two[5] = "crucible";
  const auto r = test::run_command(two);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_contains(r.out, "predict: 501 samples in");
  expect_contains(r.out, "over 2 ranks");
  const std::string a = test::read_text(path("dist/one.jsonl")), b = test::read_text(path("dist/two.jsonl"));
  std::printf("1 process: %zu bytes, 2 ranks: %zu bytes, identical: %s\n", a.size(), b.size(),
              a == b ? "yes" : "no");
  EXPECT_EQ(read_jsonl(path("dist/two.jsonl")).size(), static_cast<size_t>(kTestSamples));
  EXPECT_TRUE(a == b) << "the 2-rank file differs from the 1-process file";
  EXPECT_EQ(r.out.find("[rank 1]"), std::string::npos) << r.out;
  // Only rank 0 wrote: no other file (a per-rank or temporary one) in the folder.
  int files = 0;
  for (const auto& e : fs::directory_iterator(path("dist"))) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

// bf16 autocast (the default recipe) rounds many logits to equal values: where the best two tie,
// top[0] must still be the class `crucible eval`'s argmax counts (the lower id), so the
// accuracies stay equal.
// Without a run to take a checkpoint from, predict takes the config's own weights: model.init
// (here the run's checkpoint saved by python3-torch as a plain state dict, "model." prefix
// off) gives the very file the checkpoint gives. With neither, exit 2 naming all three sources.
TEST_F(PredictCli, ModelInitWeightsPredictWithoutARun) {
  test::run_python("import json, struct, torch, numpy as np\n"
                   "b = open('" + checkpoint() + "', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]\n"
                   "h = json.loads(b[8:8 + n]); dt = {'F32': np.float32, 'I64': np.int64}\n"
                   "sd = {k[6:]: torch.from_numpy(np.frombuffer(b[8 + n + e['data_offsets'][0]:8 + n + "
                   "e['data_offsets'][1]], dt[e['dtype']]).reshape(e['shape']).copy())\n"
                   "      for k, e in h.items() if k.startswith('model.')}\n"
                   "torch.save(sd, '" + path("weights.pt") + "')\n");
  auto ckpt = test::run_command(predict({"--top", "3", "--out", path("ckpt.jsonl")}));
  ASSERT_EQ(ckpt.exit_code, 0) << ckpt.out << ckpt.err;
  std::vector<std::string> cmd = {test::crucible_binary(), "predict", "--set", "run.dir=" + dir_->path(),
                                  "--set", "run.name=never-trained", "--set",
                                  "data.test_samples=" + std::to_string(kTestSamples),
                                  "--set", "train.precision=fp32", "--set", "train.channels_last=false",
                                  "--set", "model.init=" + path("weights.pt"),
                                  "--top", "3", "--out", path("init.jsonl")};
  auto init = test::run_command(cmd);
  ASSERT_EQ(init.exit_code, 0) << init.out << init.err;
  expect_contains(init.out + init.err, {"model.init weights from", "weights.pt"});
  EXPECT_EQ(test::read_text(path("init.jsonl")), test::read_text(path("ckpt.jsonl")));
  // No checkpoint, no model.init: exit 2, nothing written.
  cmd[cmd.size() - 5] = "model.init=";
  cmd.back() = path("none.jsonl");
  auto none = test::run_command(cmd);
  EXPECT_EQ(none.exit_code, 2) << none.out << none.err;
  expect_contains(none.err, {"never-trained", "--checkpoint", "model.init", "torchscript"});
  EXPECT_FALSE(fs::exists(path("none.jsonl")));
}

TEST(PredictCliBf16, TiedLogitsRankAsEvalsArgmax) {
  test::TempDir d;
  const std::vector<std::string> job = {"--set", "run.dir=" + d.path(), "--set", "run.name=bf", "--set",
                                        "data.test_samples=2000"};
  std::vector<std::string> train = {test::crucible_binary(), "train", "--set", "data.train_samples=2000", "--set",
                                    "train.epochs=1", "--set", "train.max_steps=8", "--set", "train.batch_size=64", "--set",
                                    "train.precision=bf16",
                                    "--set", "log.progress=lines"};
  train.insert(train.end(), job.begin(), job.end());
  const auto t = test::run_command(train);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  std::vector<std::string> eval = {test::crucible_binary(), "eval", "--json"};
  eval.insert(eval.end(), job.begin(), job.end());
  const auto e = test::run_command(eval);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const double eval_acc = json::parse(e.out.substr(e.out.rfind("\n{") + 1))["test_acc"].get<double>();
  std::vector<std::string> predict = {test::crucible_binary(), "predict", "--top", "2", "--out", d / "bf.jsonl"};
  predict.insert(predict.end(), job.begin(), job.end());
  const auto p = test::run_command(predict);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  expect_contains(p.out, "precision: bf16 (autocast mixed precision)");
  const auto rec = read_jsonl(d / "bf.jsonl");
  ASSERT_EQ(rec.size(), 2000u);
  int64_t hits = 0, ties = 0;
  for (const auto& r : rec) {
    hits += r.top[0] == r.label;
    if (r.prob[0] == r.prob[1]) {
      ++ties;
      EXPECT_LT(r.top[0], r.top[1]) << "sample " << r.index;
    }
  }
  const double acc = static_cast<double>(hits) / static_cast<double>(rec.size());
  std::printf("bf16: %lld of 2000 samples have tied best logits; top-1 %.17g, crucible eval %.17g\n",
              static_cast<long long>(ties), acc, eval_acc);
  EXPECT_GT(ties, 0) << "no tie: the case is not exercised";
  EXPECT_EQ(acc, eval_acc);
}

// Checked before any work: no run needs to exist.
TEST(PredictCliUsage, BadUsageExitsTwoAndWritesNothing) {
  test::TempDir d;
  auto predict = [&](const std::string& run, std::initializer_list<std::string> extra) {
    std::vector<std::string> cmd = {test::crucible_binary(), "predict", "--set", "run.dir=" + d.path(), "--set",
                                    "run.name=" + run};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return test::run_command(cmd);
  };
  auto r = predict("none", {"--out", d / "preds.txt"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, d / "preds.txt");
  expect_contains(r.err, "\".txt\"");
  expect_contains(r.err, ".jsonl");
  r = predict("none", {"--out", d / "preds"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "unknown extension");
  r = predict("none", {"--top", "0", "--out", d / "preds.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "--top 0");
  r = predict("none", {"--top", "-3", "--out", d / "preds.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  r = predict("none", {});  // no --out
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "--out");
  // No checkpoint: no such run, a run folder without a checkpoint that verifies, a missing file.
  r = predict("none", {"--out", d / "preds.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, d / "none/checkpoints");
  fs::create_directories(d / "empty/checkpoints");
  test::write_text(d / "empty/checkpoints/ckpt-000000001.safetensors", "not a checkpoint");
  r = predict("empty", {"--out", d / "preds.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "holds no checkpoint that verifies");
  r = predict("none", {"--checkpoint", d / "missing.safetensors", "--out", d / "preds.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, d / "missing.safetensors");
  EXPECT_FALSE(fs::exists(d / "preds.jsonl"));
  EXPECT_FALSE(fs::exists(d / "preds.txt"));
  EXPECT_FALSE(fs::exists(d / "preds"));
}

}  // namespace
}  // namespace crucible
