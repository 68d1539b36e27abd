// `crucible train` with data.dataset = "arrays": Debian's Fashion-MNIST converted by NumPy to
// .npy / .npz / .safetensors trains to the very same weights as from its IDX files (the
// consistency check of the arrays path: same samples, labels, flips and order); float features
// train and the log states their range (D4); mismatched files exit 2 naming both.
// To add a case: write arrays with test::run_python, run small_arrays_run() with extra --set
// options, and assert on the exit code, the log or summary.json.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

// A short fp32 run on one thread: a few steps over the first 2000 training samples.
std::vector<std::string> small_arrays_run(const test::TempDir& dir, const std::string& name,
                                          std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), "train",
                                  "--set", "run.dir=" + dir.path(),
                                  "--set", "run.name=" + name,
                                  "--set", "data.train_samples=2000",
                                  "--set", "data.test_samples=500",
                                  "--set", "data.threads=1",
                                  "--set", "train.epochs=1",
                                  "--set", "train.max_steps=6",
                                  "--set", "train.batch_size=128",
                                  "--set", "train.precision=fp32",
                                  "--set", "train.threads=1",
                                  "--set", "checkpoint.every_steps=100",
                                  "--set", "log.every_steps=3"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::string params_sha(const test::TempDir& dir, const std::string& name) {
  return json::parse(test::read_text(dir / (name + "/summary.json")))["params_sha256"].get<std::string>();
}

TEST(ArraysCli, FashionMnistAsNpyNpzSafetensorsTrainsLikeIdx) {
  test::TempDir d;
  test::run_python("import gzip, json, struct, numpy as np\n"
                   "r = '" + kFm + "'; d = '" + d.path() + "/'\n"
                   "def idx(name, offset, shape):\n"
                   "    return np.frombuffer(gzip.open(r + name).read()[offset:], np.uint8).reshape(shape)\n"
                   "x = idx('train-images-idx3-ubyte.gz', 16, (-1, 28, 28))\n"
                   "y = idx('train-labels-idx1-ubyte.gz', 8, (-1,)).astype(np.int64)\n"
                   "tx = idx('t10k-images-idx3-ubyte.gz', 16, (-1, 28, 28))\n"
                   "ty = idx('t10k-labels-idx1-ubyte.gz', 8, (-1,)).astype(np.int64)\n"
                   "np.save(d + 'train_x.npy', x); np.save(d + 'train_y.npy', y)\n"
                   "np.save(d + 'test_x.npy', tx); np.save(d + 'test_y.npy', ty)\n"
                   "np.savez(d + 'train.npz', x=x, y=y.astype(np.int32))\n"
                   "h, bufs, off = {}, [], 0\n"
                   "for k, a, t in (('labels', ty, 'I64'), ('images', tx, 'U8')):\n"
                   "    h[k] = {'dtype': t, 'shape': list(a.shape), 'data_offsets': [off, off + a.nbytes]}\n"
                   "    off += a.nbytes; bufs.append(a.tobytes())\n"
                   "hb = json.dumps(h).encode(); hb += b' ' * ((8 - len(hb) % 8) % 8)\n"
                   "open(d + 'test.safetensors', 'wb').write(struct.pack('<Q', len(hb)) + hb + b''.join(bufs))\n");
  auto r = test::run_command(small_arrays_run(d, "idx", {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string want = params_sha(d, "idx");

  r = test::run_command(small_arrays_run(d, "npy", {"--set", "data.dataset=arrays",
                                                    "--set", "data.train_images=" + (d / "train_x.npy"),
                                                    "--set", "data.train_labels=" + (d / "train_y.npy"),
                                                    "--set", "data.test_images=" + (d / "test_x.npy"),
                                                    "--set", "data.test_labels=" + (d / "test_y.npy")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(params_sha(d, "npy"), want);
  // D4 / D13: the log states the dtype, shape, range and that the features are mapped.
  expect_contains(r.out, "train_x.npy: uint8 [60000, 28, 28] (2000 used, memory-mapped (D13))");
  expect_contains(r.out, "min 0, max 255");
  expect_contains(r.out, "data.mean = [0.286]");

  r = test::run_command(small_arrays_run(d, "npz", {"--set", "data.dataset=arrays",
                                                    "--set", "data.train_images=" + (d / "train.npz:x"),
                                                    "--set", "data.train_labels=" + (d / "train.npz:y"),
                                                    "--set", "data.test_images=" + (d / "test.safetensors:images"),
                                                    "--set", "data.test_labels=" + (d / "test.safetensors:labels")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(params_sha(d, "npz"), want);
  EXPECT_EQ(r.err.find("D13"), std::string::npos) << r.err;  // nothing was copied into RAM
}

// predict and eval need only the test data: with data.train_* naming files that do not exist
// they run on the test arrays alone. The test arrays here lack class 9, so the class count
// comes from the checkpoint (10: --top 10 lists all ten), not from the data (9). The file
// predict writes is the one it writes when the training arrays are given too.
TEST(ArraysCli, PredictAndEvalNeedOnlyTheTestArrays) {
  test::TempDir d;
  test::run_python("import gzip, numpy as np\n"
                   "r = '" + kFm + "'; d = '" + d.path() + "/'\n"
                   "def idx(name, offset, shape):\n"
                   "    return np.frombuffer(gzip.open(r + name).read()[offset:], np.uint8).reshape(shape)\n"
                   "x = idx('train-images-idx3-ubyte.gz', 16, (-1, 28, 28))[:2000]\n"
                   "y = idx('train-labels-idx1-ubyte.gz', 8, (-1,)).astype(np.int64)[:2000]\n"
                   "tx = idx('t10k-images-idx3-ubyte.gz', 16, (-1, 28, 28))\n"
                   "ty = idx('t10k-labels-idx1-ubyte.gz', 8, (-1,)).astype(np.int64)\n"
                   "keep = np.flatnonzero(ty != 9)[:300]\n"
                   "np.save(d + 'train_x.npy', x); np.save(d + 'train_y.npy', y)\n"
                   "np.save(d + 'test_x.npy', tx[:500]); np.save(d + 'test_y.npy', ty[:500])\n"
                   "np.save(d + 'no9_x.npy', tx[keep]); np.save(d + 'no9_y.npy', ty[keep])\n");
  auto r = test::run_command(small_arrays_run(d, "t", {"--set", "data.dataset=arrays",
                                                       "--set", "data.train_images=" + (d / "train_x.npy"),
                                                       "--set", "data.train_labels=" + (d / "train_y.npy"),
                                                       "--set", "data.test_images=" + (d / "test_x.npy"),
                                                       "--set", "data.test_labels=" + (d / "test_y.npy")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto job = [&](const std::string& sub, const std::string& train_x, const std::string& train_y) {
    return std::vector<std::string>{test::crucible_binary(), sub, "--set", "run.dir=" + d.path(), "--set", "run.name=t",
                                    "--set", "data.dataset=arrays", "--set", "data.train_images=" + train_x,
                                    "--set", "data.train_labels=" + train_y, "--set", "data.test_samples=0",
                                    "--set", "data.test_images=" + (d / "no9_x.npy"),
                                    "--set", "data.test_labels=" + (d / "no9_y.npy")};
  };
  auto predict = job("predict", d / "missing/train_x.npy", d / "missing/train_y.npy");
  predict.insert(predict.end(), {"--top", "10", "--out", d / "alone.jsonl"});
  r = test::run_command(predict);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_contains(r.out, "the training split is not opened");
  std::istringstream lines(test::read_text(d / "alone.jsonl"));
  int64_t records = 0, hits = 0;
  for (std::string line; std::getline(lines, line); ++records) {
    const json j = json::parse(line);
    EXPECT_NE(j["label"], 9);
    hits += j["top"][0] == j["label"];
    EXPECT_EQ(j["top"].size(), 10u) << line;  // the model's ten classes, class 9 among them
  }
  EXPECT_EQ(records, 300);
  predict = job("predict", d / "train_x.npy", d / "train_y.npy");
  predict.insert(predict.end(), {"--top", "10", "--out", d / "with_train.jsonl"});
  r = test::run_command(predict);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(test::read_text(d / "with_train.jsonl"), test::read_text(d / "alone.jsonl"));
  auto eval = job("eval", d / "missing/train_x.npy", d / "missing/train_y.npy");
  eval.push_back("--json");
  r = test::run_command(eval);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_DOUBLE_EQ(json::parse(r.out.substr(r.out.rfind('{')))["test_acc"].get<double>(),
                   static_cast<double>(hits) / 300);
}

TEST(ArraysCli, FloatFeaturesTrainAndUnnormalisedOnesAreFlaggedD4) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "d = '" + d.path() + "/'\n"
                   "rng = np.random.default_rng(0)\n"
                   "for split, n in (('train', 2000), ('test', 500)):\n"
                   "    np.save(d + split + '_y.npy', rng.integers(0, 4, n))\n"
                   "    np.save(d + split + '_ok.npy', rng.standard_normal((n, 2, 8, 8)).astype(np.float32))\n"
                   "    np.save(d + split + '_byte.npy', rng.integers(0, 256, (n, 2, 8, 8)).astype(np.float32))\n");
  auto args = [&](const std::string& name, const std::string& kind) {
    return small_arrays_run(d, name, {"--set", "data.dataset=arrays",
                                      "--set", "data.train_images=" + (d / ("train_" + kind + ".npy")),
                                      "--set", "data.train_labels=" + (d / "train_y.npy"),
                                      "--set", "data.test_images=" + (d / ("test_" + kind + ".npy")),
                                      "--set", "data.test_labels=" + (d / "test_y.npy")});
  };
  auto r = test::run_command(args("ok", "ok"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "float32 [2000, 2, 8, 8]");
  expect_contains(r.out, "used as they are");
  EXPECT_EQ(r.err.find("un-normalised"), std::string::npos) << r.err;
  const json s = json::parse(test::read_text(d / "ok/summary.json"));
  EXPECT_EQ(s["params_sha256"].get<std::string>().size(), 64u);

  r = test::run_command(args("byte", "byte"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.err, "un-normalised (0-255 pixel values?)");
  expect_contains(r.err, d / "train_byte.npy");
}

TEST(ArraysCli, MismatchedFilesExitTwoNamingBoth) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "d = '" + d.path() + "/'\n"
                   "np.save(d + 'x.npy', np.zeros((100, 1, 8, 8), np.float32))\n"
                   "np.save(d + 'tx.npy', np.zeros((50, 1, 4, 4), np.float32))\n"
                   "np.save(d + 'y.npy', np.zeros(100, np.int64))\n"
                   "np.save(d + 'ty.npy', np.zeros(50, np.int64))\n"
                   "np.savez(d + 'two.npz', a=np.zeros(100, np.int64), b=np.zeros(100, np.int64))\n");
  auto run = [&](const std::string& x, const std::string& y, const std::string& tx, const std::string& ty) {
    return test::run_command(small_arrays_run(d, "bad", {"--set", "data.dataset=arrays",
                                                         "--set", "data.train_images=" + (d / x),
                                                         "--set", "data.train_labels=" + (d / y),
                                                         "--set", "data.test_images=" + (d / tx),
                                                         "--set", "data.test_labels=" + (d / ty),
                                                         "--set", "data.train_samples=0",
                                                         "--set", "data.test_samples=0"}));
  };
  auto r = run("x.npy", "y.npy", "tx.npy", "ty.npy");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, d / "x.npy");
  expect_contains(r.err, d / "tx.npy");
  expect_contains(r.err, "[1, 8, 8]");
  r = run("x.npy", "ty.npy", "x.npy", "y.npy");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "x.npy holds 100 samples");
  expect_contains(r.err, "ty.npy holds 50 labels");
  r = run("x.npy", "two.npz", "x.npy", "y.npy");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "two.npz holds 2 arrays (a, b)");
}

}  // namespace
}  // namespace crucible
