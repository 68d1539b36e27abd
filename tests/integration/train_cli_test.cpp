// The `crucible train` program end to end, on subsets of Debian's Fashion-MNIST: exit codes
// and messages for bad config (2), the run folder's contents, bit-exact resume after SIGKILL
// in the second epoch (law 1, law 5), fallback past a truncated checkpoint, reruns of a
// finished or different run, the same weights with the batch feeder running ahead (D9), and
// (label slow) the default recipe on 2 ranks against 1.
// To add a case: build the command with small_run() and assert on files in the run folder.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/memory.h"
#include "crucible/train/schedule.h"
#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kStepsPerEpoch = 32;  // 4096 samples / batch 128 (2 epochs: resumes happen in the second)

std::vector<std::string> small_run(const test::TempDir& dir, const std::string& name, int epochs = 2) {
  return {test::crucible_binary(), "train",
          "--set", "run.dir=" + dir.path(),
          "--set", "run.name=" + name,
          "--set", "data.train_samples=4096",
          "--set", "data.test_samples=1000",
          "--set", "train.epochs=" + std::to_string(epochs),
          "--set", "train.batch_size=128",
          "--set", "checkpoint.every_steps=5",
          "--set", "log.every_steps=8"};
}

std::vector<std::string> with(std::vector<std::string> cmd, std::initializer_list<std::string> extra) {
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

json read_json(const std::string& path) { return json::parse(test::read_text(path)); }

// Checkpoint steps present in a run folder.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && n.size() == 5 + 9 + 12 && n.find(".tmp-") == std::string::npos) {
      steps.push_back(std::stoll(n.substr(5, 9)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// (type, step) of each record of a metrics.jsonl, in order.
std::vector<std::pair<std::string, int64_t>> metric_records(const std::string& path) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::istringstream lines(test::read_text(path));
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line);
    out.emplace_back(j["type"], j["step"]);
  }
  return out;
}

using test::expect_contains;

TEST(TrainCli, BadConfigExitsTwoNamingTheKey) {
  test::TempDir d;
  auto r = test::run_command({test::crucible_binary(), "train", "--set", "optim.lrr=0.1"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "optim.lrr");
  expect_contains(r.err, "did you mean 'lr'");

  r = test::run_command({test::crucible_binary(), "train", "--set", "optim.lr=-0.001"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "optim.lr");
  expect_contains(r.err, "> 0");

  test::write_text(d / "bad_type.toml", "[train]\nepochs = \"ten\"\n");
  r = test::run_command({test::crucible_binary(), "train", d / "bad_type.toml"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "bad_type.toml:2");
  expect_contains(r.err, "train.epochs");
  expect_contains(r.err, "expected integer");

  test::write_text(d / "unknown.toml", "[optim]\nname = \"adamw\"\nmomentun = 0.9\n");
  r = test::run_command({test::crucible_binary(), "train", d / "unknown.toml"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "optim.momentun");

  r = test::run_command({test::crucible_binary(), "train", d / "missing.toml"});
  EXPECT_EQ(r.exit_code, 2);

  r = test::run_command({test::crucible_binary(), "frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(TrainCli, BadDataAndUnitsExitTwo) {
  test::TempDir d;
  auto r = test::run_command(with(small_run(d, "x"), {"--set", "data.train_images=" + (d / "nope.gz")}));
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, d / "nope.gz");
  // D4: a 0-255 mean declared as 0-1 units is refused before training.
  r = test::run_command(with(small_run(d, "y"), {"--set", "data.mean=[72.9]", "--set", "data.std=[90.0]"}));
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "look like 0-255 values");
}

TEST(TrainCli, HelpListsKeysWithDefaults) {
  auto r = test::run_command({test::crucible_binary(), "train", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"[optim]", "lr", "0.002", "[train]", "precision", "\"bf16\"", "[checkpoint]", "every_steps",
                        "--set", "--resume"}) {
    expect_contains(r.out, s);
  }
}

// T6: the step reads the host once (the finiteness vote), the log interval once more (law 2);
// summary.json counts them by reason from host_values(), the only way the training path reads
// (tests/scripts/host_reads_test.py). A new read in the step changes these numbers.
TEST(TrainCli, HostReadsPerStepAreTheVoteAndTheIntervalT6) {
  test::TempDir d;
  auto r = test::run_command(with(small_run(d, "reads"), {"--set", "train.max_steps=40", "--set", "log.every_steps=10"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json s = read_json(d / "reads/summary.json");
  EXPECT_EQ(s["host_reads"], json::parse(R"({"step_vote": 40, "interval": 4, "sync_bn_count": 0, "diagnosis": 0,
                                            "histogram": 0, "replicas": 0})"));
  EXPECT_DOUBLE_EQ(s["host_reads_per_step"].get<double>(), 1.1);
}

// T5 and T9, read back from torch's context at the end of the run (summary.json), not from the
// config: the matmul precision asked for is the one torch used; cuDNN's autotuner is on for the
// pipeline's fixed shape and off when train.multi_scale changes the shape at every step (each
// new shape would be tuned again) and in deterministic mode.
TEST(TrainCli, MatmulPrecisionAndCudnnBenchmarkAreReadBackT5T9) {
  test::TempDir d;
  auto run = [&](const std::string& name, std::initializer_list<std::string> extra) {
    auto cmd = with(small_run(d, name, 1), {"--set", "train.max_steps=2", "--set", "data.test_samples=100"});
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    auto r = test::run_command(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return std::make_pair(read_json(d / (name + "/summary.json")), r.out);
  };
  auto [medium, medium_out] = run("medium", {"--set", "train.matmul_precision=medium"});
  EXPECT_EQ(medium["matmul_precision"], "medium");
  EXPECT_EQ(medium["tf32"]["matmul"], true);
  EXPECT_EQ(medium["tf32"]["conv"], true);
  EXPECT_EQ(medium["cudnn_benchmark"], true);
  // "highest": no TF32 anywhere, convolutions included (torch's own default leaves them on).
  auto [highest, highest_out] = run("highest", {"--set", "train.matmul_precision=highest"});
  EXPECT_EQ(highest["matmul_precision"], "highest");
  EXPECT_EQ(highest["tf32"]["matmul"], false);
  EXPECT_EQ(highest["tf32"]["conv"], false);
  auto [high, high_out] = run("high", {"--set", "train.matmul_precision=high", "--set", "train.multi_scale=[20, 28]"});
  EXPECT_EQ(high["matmul_precision"], "high");
  EXPECT_EQ(high["cudnn_benchmark"], false);
  expect_contains(high_out, "cuDNN benchmark mode off (T9): train.multi_scale changes the input shape");
  EXPECT_EQ(medium_out.find("cuDNN benchmark mode off"), std::string::npos);
  auto [det, det_out] = run("det", {"--set", "train.deterministic=true"});
  EXPECT_EQ(det["matmul_precision"], "high");  // the default
  EXPECT_EQ(det["cudnn_benchmark"], false);
}

TEST(TrainCli, RunFolderHoldsConfigMetricsCheckpointsAndSummary) {
  test::TempDir d;
  auto r = test::run_command(small_run(d, "folder", 1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run = d / "folder";
  // The resolved config reads back as the same job (and names every section).
  const std::string cfg = test::read_text(run + "/config.toml");
  for (const char* s : {"[run]", "[data]", "[model]", "[optim]", "[schedule]", "[train]", "[checkpoint]", "[log]",
                        "train_samples = 4096"}) {
    expect_contains(cfg, s);
  }
  // metrics.jsonl: one train record per log interval, one eval record per epoch.
  int train_records = 0, eval_records = 0;
  json last_eval;
  std::istringstream lines(test::read_text(run + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line);
    if (j["type"] == "train") {
      ++train_records;
      // T4: each parameter group's update at the interval's last step, beside its weight norm.
      for (const char* g : {"weights", "bias_and_norm"}) {
        EXPECT_GT(j["update_norm"][g].get<double>(), 0.0) << line;
        EXPECT_LT(j["update_norm"][g].get<double>(), j["weight_norm"][g].get<double>()) << line;
      }
    }
    if (j["type"] == "eval") {
      ++eval_records;
      EXPECT_EQ(j["samples"], 1000);
      // X5: top-5 beside top-1, never below it (10 classes: k = 5).
      EXPECT_GE(j["test_top5"].get<double>(), j["test_acc"].get<double>());
      EXPECT_LE(j["test_top5"].get<double>(), 1.0);
      last_eval = j;
    }
  }
  EXPECT_EQ(train_records, kStepsPerEpoch / 8);
  EXPECT_EQ(eval_records, 1);
  json s = read_json(run + "/summary.json");
  for (const char* k : {"test_acc", "test_top5", "train_seconds", "wall_seconds", "samples_per_s", "precision",
                        "memory_format", "params_sha256"}) {
    EXPECT_TRUE(s.contains(k)) << k;
  }
  EXPECT_EQ(s["test_top5"], last_eval["test_top5"]);
  expect_contains(test::read_text(run + "/train.log"), "(top-5 ");
  EXPECT_GT(s["test_acc"].get<double>(), 0.5);
  EXPECT_LE(s["test_acc"].get<double>(), 1.0);
  EXPECT_EQ(s["params_sha256"].get<std::string>().size(), 64u);
  // precision = "auto" (the default) on a CPU: bf16 where it computes bf16 in hardware, else fp32.
  EXPECT_EQ(s["precision_source"], "auto");
  EXPECT_EQ(s["precision"], cpu_has_native_bf16() ? "bf16" : "fp32");
  EXPECT_EQ(s["step_dtype"], cpu_has_native_bf16() ? "BFloat16" : "Float");
  EXPECT_EQ(s["memory_format"], "channels_last");
  EXPECT_EQ(checkpoint_steps(run).back(), kStepsPerEpoch);
  EXPECT_LE(checkpoint_steps(run).size(), 3u);  // keep = 3
  // Off a terminal: plain lines, no carriage returns; a final summary line.
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  expect_contains(r.out, "epoch 1/1 step 8/32");
  expect_contains(r.out, "done: test accuracy");
  expect_contains(r.out, "seed 0 → streams");  // T15: the seeds are stated

  // Law 3: the checkpoint keeps the input convention the model was trained on. Evaluating it
  // with the same data gives the run's accuracy; with another normalisation it is refused
  // before any work, naming both.
  const std::vector<std::string> eval = {test::crucible_binary(), "eval", "--json", "--set", "run.dir=" + d.path(),
                                         "--set", "run.name=folder", "--set", "data.test_samples=1000"};
  auto ok = test::run_command(eval);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out.substr(ok.out.rfind('{')))["test_acc"], s["test_acc"]);
  std::vector<std::string> other = eval;
  other.insert(other.end(), {"--set", "data.mean=[0.5]"});
  auto bad = test::run_command(other);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  expect_contains(bad.err, "was trained on inputs normalised with mean [0.286] std [0.353]");
  expect_contains(bad.err, "normalises with mean [0.5]");
  expect_contains(bad.err, "data.mean");
}

// A full disk during training: the run folder is a 64 MiB tmpfs with ~35 MiB free, and
// checkpoints of ~10 MiB with keep = 3 (four at once while a new one is written) do not fit.
// The start warns and names the keep that fits; the fourth checkpoint fails: exit 1, naming
// the file, the space free and needed, and the newest checkpoint, which is intact (no temporary
// left, metrics.jsonl whole). A rerun there is refused (exit 2: not one checkpoint fits), as
// `crucible doctor` says; after the tmpfs grows, the rerun resumes and ends with the
// uninterrupted run's params_sha256.
TEST(TrainCli, FullDiskStopsTheRunAndARerunAfterResumesBitExact) {
  test::TempDir d;
  test::SmallDisk disk(d / "disk", 64);
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  auto run = [&](const std::string& dir) {
    return with(small_run(d, "full", 2), {"--set", "run.dir=" + dir, "--set", "data.test_samples=200"});
  };
  const auto clean = test::run_command(run(d / "clean"));
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  test::fill_disk(disk.path(), "filler", 35 << 20);
  const auto full = test::run_command(run(disk.path()));
  EXPECT_EQ(full.exit_code, 1) << full.out << full.err;
  expect_contains(full.err, "disk: ");
  expect_contains(full.err, "Set checkpoint.keep = 2");
  expect_contains(full.err, "the checkpoint of step 20 was not written: cannot write ");
  expect_contains(full.err, "/full/checkpoints/ckpt-000000020.safetensors: No space left on device: ");
  expect_contains(full.err, "free on the file system of");
  expect_contains(full.err, "the file needs ");
  expect_contains(full.err, "The newest checkpoint, ");
  expect_contains(full.err, "ckpt-000000015.safetensors, is intact");
  const std::string run_dir = disk.path() + "/full";
  EXPECT_EQ(checkpoint_steps(run_dir), (std::vector<int64_t>{5, 10, 15}));
  for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints")) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
  std::istringstream lines(test::read_text(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) EXPECT_NO_THROW(json::parse(line)) << line;

  const auto refused = test::run_command(run(disk.path()));
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  expect_contains(refused.err, "not even one checkpoint fits");
  auto doctor = run(disk.path());
  doctor[1] = "doctor";
  const auto doc = test::run_command(doctor);
  EXPECT_NE(doc.exit_code, 0);
  expect_contains(doc.out, "fail  disk");

  disk.resize(128);
  const auto again = test::run_command(run(disk.path()));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  expect_contains(again.out, "resumed from " + run_dir + "/checkpoints/ckpt-000000015.safetensors");
  EXPECT_EQ(read_json(run_dir + "/summary.json")["params_sha256"], read_json(d / "clean/full/summary.json")["params_sha256"]);
}

// Starts a run, SIGKILLs it at a mid-epoch checkpoint of the second epoch, returns the step of
// that checkpoint.
int64_t kill_in_second_epoch(const test::TempDir& d, const std::string& name,
                             std::initializer_list<std::string> extra = {}) {
  test::Child child(with(small_run(d, name), extra), d.path());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto steps = checkpoint_steps(d / name);
    if (!steps.empty() && steps.back() > kStepsPerEpoch && steps.back() < 2 * kStepsPerEpoch - 5) {
      child.kill(SIGKILL);
      EXPECT_EQ(child.wait(), 128 + SIGKILL);
      return steps.back();
    }
    if (!child.running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ADD_FAILURE() << "run ended or stalled before a second-epoch checkpoint:\n" << child.err();
  return -1;
}

// One run per folder (issue 35): while a run trains, a second `crucible train` on its folder (with
// --restart too) and a `crucible launch` of one exit 2 naming the holder (pid, host, since when),
// and the first finishes untouched: its weights and its metrics are those of the same run alone.
// (A SIGKILLed run leaves no lock behind: KilledInSecondEpochResumesBitForBit resumes in its folder.)
TEST(TrainCli, ASecondRunOnAFolderInUseExitsTwoNamingTheHolderX6) {
  test::TempDir d;
  const auto alone = test::run_command(small_run(d, "alone", 1));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  ::setenv("CRUCIBLE_TEST_SLOW_RANK", "0:150", 1);  // ~5 s more over the epoch's 32 steps: time to try
  test::Child first(small_run(d, "shared", 1), d.path());
  ::unsetenv("CRUCIBLE_TEST_SLOW_RANK");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && first.running() &&
         !fs::exists(d / "shared/checkpoints/ckpt-000000005.safetensors")) {  // it trains
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(first.running()) << first.err();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string holder = "pid " + std::to_string(first.pid()) + " on host " + host;
  auto second = test::run_command(small_run(d, "shared", 1));
  EXPECT_EQ(second.exit_code, 2) << second.err;
  expect_contains(second.err, {"run folder", "is in use by", holder.c_str(), "since", "run.name"});
  auto restart = test::run_command(with(small_run(d, "shared", 1), {"--restart"}));
  EXPECT_EQ(restart.exit_code, 2) << restart.err;
  expect_contains(restart.err, holder);
  std::vector<std::string> launch = {test::crucible_binary(), "launch", "--nproc", "2", "--"};
  for (const auto& a : small_run(d, "shared", 1)) launch.push_back(a);
  auto launched = test::run_command(launch);
  EXPECT_EQ(launched.exit_code, 2) << launched.err;
  expect_contains(launched.err, holder);
  EXPECT_TRUE(first.running()) << "the refusals must come while the first run trains";
  ASSERT_EQ(first.wait(), 0) << first.err();
  EXPECT_EQ(read_json(d / "shared/summary.json")["params_sha256"], read_json(d / "alone/summary.json")["params_sha256"]);
  EXPECT_EQ(metric_records(d / "shared/metrics.jsonl"), metric_records(d / "alone/metrics.jsonl"));
  EXPECT_EQ(checkpoint_steps(d / "shared"), checkpoint_steps(d / "alone"));
  // Free again once it ended: a rerun finds the run complete.
  auto rerun = test::run_command(small_run(d, "shared", 1));
  EXPECT_EQ(rerun.exit_code, 0) << rerun.err;
  expect_contains(rerun.out, "already complete");
}

// T13: at every epoch end what the epoch's tensors left with the allocator goes back — on the CPU
// the freed heap that glibc keeps for the next step's speed (tune_host_allocator), through
// malloc_trim. The same run with and without train.release_cache: with it each epoch end gives
// back tens of MiB and the process holds that much less after it; without it nothing is given
// back; the weights are the same.
TEST(TrainCli, EpochEndsGiveTheAllocatorsCachedMemoryBackT13) {
  test::TempDir d;
  auto run = [&](const std::string& name, const std::string& release) {
    auto r = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set",
                                "run.name=" + name, "--set", "data.train_samples=1024", "--set",
                                "data.test_samples=1000", "--set", "train.epochs=2", "--set", "train.batch_size=128",
                                "--set", "train.eval_batch_size=500", "--set", "train.release_cache=" + release});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_json(d / (name + "/summary.json"));
  };
  test::expect_epoch_ends_released(run("release", "true"), run("keep", "false"), int64_t{16} << 20);
}

TEST(TrainCli, KilledInSecondEpochResumesBitForBit) {
  test::TempDir d;
  auto ref = test::run_command(small_run(d, "uninterrupted"));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const json want = read_json(d / "uninterrupted/summary.json");

  const int64_t killed_at = kill_in_second_epoch(d, "killed");
  ASSERT_GT(killed_at, kStepsPerEpoch);
  auto resumed = test::run_command(small_run(d, "killed"));  // a rerun resumes
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const json got = read_json(d / "killed/summary.json");
  expect_contains(resumed.out, "resumed from");
  EXPECT_GT(got["resumed_from_step"].get<int64_t>(), kStepsPerEpoch);
  EXPECT_NE(got["resumed_from_step"].get<int64_t>() % kStepsPerEpoch, 0);  // mid-epoch
  EXPECT_EQ(got["params_sha256"], want["params_sha256"]);
  EXPECT_EQ(got["test_acc"], want["test_acc"]);
  EXPECT_EQ(got["samples"], want["samples"]);
  // The metrics file has no duplicate or missing records after the resume.
  EXPECT_EQ(metric_records(d / "killed/metrics.jsonl"), metric_records(d / "uninterrupted/metrics.jsonl"));
}

// Issue 26's recipe: TrivialAugment and random erasing drawn per sample, MixUp/CutMix per batch
// from (seed, step, rank), label smoothing over the soft targets, and the weight EMA: a run killed
// mid-epoch and resumed ends with the uninterrupted run's weights, EMA included (law 1, law 5;
// PITFALLS T15: every stream from the one seed, per sample, per step).
TEST(TrainCli, KilledWithTheModernRecipeResumesBitForBitEmaIncluded) {
  const std::initializer_list<std::string> recipe = {
      "--set", "data.augment=trivialaugment_wide", "--set", "data.random_erase=0.25", "--set", "data.mixup_alpha=0.2",
      "--set", "data.cutmix_alpha=1.0",           "--set", "loss.label_smoothing=0.1", "--set", "train.ema=true",
      "--set", "train.ema_steps=4"};
  test::TempDir d;
  auto ref = test::run_command(with(small_run(d, "uninterrupted"), recipe));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const json want = read_json(d / "uninterrupted/summary.json");
  ASSERT_TRUE(want.contains("ema_sha256")) << want.dump();
  const int64_t killed_at = kill_in_second_epoch(d, "killed", recipe);
  ASSERT_GT(killed_at, kStepsPerEpoch);
  auto resumed = test::run_command(with(small_run(d, "killed"), recipe));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const json got = read_json(d / "killed/summary.json");
  EXPECT_NE(got["resumed_from_step"].get<int64_t>() % kStepsPerEpoch, 0);  // mid-epoch
  EXPECT_EQ(got["params_sha256"], want["params_sha256"]);
  EXPECT_EQ(got["ema_sha256"], want["ema_sha256"]);
  EXPECT_EQ(got["test_acc_ema"], want["test_acc_ema"]);
  // The recipe changed the training: a run without it ends elsewhere.
  auto plain = test::run_command(small_run(d, "plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(read_json(d / "plain/summary.json")["params_sha256"], want["params_sha256"]);
  // Mixed targets still train: above chance (10 classes) after two short epochs.
  EXPECT_GT(want["test_acc"].get<double>(), 0.5);
}

TEST(TrainCli, TruncatedNewestCheckpointIsSkippedWithAWarning) {
  test::TempDir d;
  auto ref = test::run_command(small_run(d, "reference"));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const int64_t killed_at = kill_in_second_epoch(d, "damaged");
  ASSERT_GT(killed_at, 0);
  const auto steps = checkpoint_steps(d / "damaged");
  ASSERT_GE(steps.size(), 2u);
  char newest[64];
  std::snprintf(newest, sizeof(newest), "/checkpoints/ckpt-%09lld.safetensors", static_cast<long long>(steps.back()));
  const std::string path = d / "damaged" + newest;
  fs::resize_file(path, fs::file_size(path) / 2);
  auto r = test::run_command(with(small_run(d, "damaged"), {"--resume"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.err, "skipping checkpoint");
  expect_contains(r.err, newest + 1);
  const json got = read_json(d / "damaged/summary.json");
  EXPECT_EQ(got["resumed_from_step"], steps[steps.size() - 2]);
  EXPECT_EQ(got["params_sha256"], read_json(d / "reference/summary.json")["params_sha256"]);
}

TEST(TrainCli, RerunsOfFinishedOrDifferentRuns) {
  test::TempDir d;
  ASSERT_EQ(test::run_command(small_run(d, "r", 1)).exit_code, 0);
  const json first = read_json(d / "r/summary.json");
  // Finished: says so, exits 0, changes nothing.
  auto again = test::run_command(small_run(d, "r", 1));
  EXPECT_EQ(again.exit_code, 0) << again.err;
  expect_contains(again.out, "already complete");
  EXPECT_EQ(read_json(d / "r/summary.json")["params_sha256"], first["params_sha256"]);
  // A different job in the same folder: refused, naming the key, nothing touched.
  auto other = test::run_command(with(small_run(d, "r", 1), {"--set", "optim.lr=0.01"}));
  EXPECT_EQ(other.exit_code, 2);
  expect_contains(other.err, "optim.lr");
  expect_contains(other.err, "--restart");
  EXPECT_EQ(read_json(d / "r/summary.json")["params_sha256"], first["params_sha256"]);
  // Logging is cosmetic: allowed.
  EXPECT_EQ(test::run_command(with(small_run(d, "r", 1), {"--set", "log.every_steps=4"})).exit_code, 0);
  // --restart trains again from scratch (same seed → same result).
  auto restarted = test::run_command(with(small_run(d, "r", 1), {"--restart"}));
  EXPECT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_TRUE(read_json(d / "r/summary.json")["resumed_from_step"].is_null());
  EXPECT_EQ(read_json(d / "r/summary.json")["params_sha256"], first["params_sha256"]);
  // --resume with nothing to resume is a usage error.
  EXPECT_EQ(test::run_command(with(small_run(d, "none", 1), {"--resume"})).exit_code, 2);
}

// D9: a feeder that keeps batches queued ahead of the step (a GPU's data.prefetch; forced on the
// CPU by CRUCIBLE_TEST_FEEDER_AHEAD) hands the steps the same batches in the same order as one that
// pulls each batch when the step takes it, so two epochs end with the same weights: 3 ahead, 4
// (data.prefetch's default) and 9, more than the epoch's 8 steps, so the queue runs dry at each
// epoch's end. summary.json says how far the feeder really ran ahead.
TEST(TrainCli, FeederRunningAheadTrainsTheSameWeightsD9) {
  test::TempDir d;
  auto run = [&](const std::string& name, const std::string& ahead) {
    if (!ahead.empty()) ::setenv("CRUCIBLE_TEST_FEEDER_AHEAD", ahead.c_str(), 1);
    auto r = test::run_command(with(small_run(d, name), {"--set", "data.train_samples=1024"}));  // 8 steps an epoch
    ::unsetenv("CRUCIBLE_TEST_FEEDER_AHEAD");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::make_pair(read_json(d / (name + "/summary.json")), r.out + r.err);
  };
  const auto [plain, plain_log] = run("plain", "");
  ASSERT_EQ(plain["steps"], 16) << plain.dump();
  EXPECT_EQ(plain["feeder"]["ahead"], 0);
  EXPECT_EQ(plain["feeder"]["most_ahead"], 0);
  expect_contains(plain_log, "converted when taken;");
  for (const auto& [ahead, most] : std::vector<std::pair<int, int>>{{3, 3}, {4, 4}, {9, 7}}) {
    SCOPED_TRACE(fmt::format("{} batches ahead", ahead));
    const auto [got, text] = run(fmt::format("ahead{}", ahead), std::to_string(ahead));
    EXPECT_EQ(got["feeder"]["ahead"], ahead);
    EXPECT_EQ(got["feeder"]["most_ahead"], most);  // 9 ahead: an epoch's 8 batches, one of them taken
    expect_contains(text, fmt::format("{} batches pulled ahead", ahead));
    EXPECT_EQ(got["params_sha256"], plain["params_sha256"]);
    EXPECT_EQ(got["test_loss"], plain["test_loss"]);
    EXPECT_EQ(metric_records(d / fmt::format("ahead{}/metrics.jsonl", ahead)), metric_records(d / "plain/metrics.jsonl"));
  }
  // A seam given a value that is not a count of batches is refused, naming it.
  ::setenv("CRUCIBLE_TEST_FEEDER_AHEAD", "many", 1);
  auto bad = test::run_command(small_run(d, "bad", 1));
  ::unsetenv("CRUCIBLE_TEST_FEEDER_AHEAD");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  expect_contains(bad.err, {"CRUCIBLE_TEST_FEEDER_AHEAD=many", "whole number"});
}

// A run folder from before data.sampler = "auto" (issue 37) names the order "auto" picks for its
// data, "distributed": it resumes. One moved elsewhere resumes too (run.dir and run.name say where
// the folder is, not what it holds); another order is still another job.
TEST(TrainCli, AFolderNamingTheOrderAutoPicksOrMovedElsewhereResumes) {
  test::TempDir d;
  auto stopped = test::run_command(with(small_run(d, "old", 1), {"--set", "train.max_steps=8"}));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  std::string config = test::read_text(d / "old/config.toml");
  const size_t at = config.find("sampler = \"auto\"");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, std::string("sampler = \"auto\"").size(), "sampler = \"distributed\"");
  test::write_text(d / "old/config.toml", config);
  fs::create_directories(d / "moved");
  fs::rename(d / "old", d / "moved/old");
  auto other = test::run_command(with(small_run(d, "old", 1), {"--set", "run.dir=" + (d / "moved"), "--set",
                                                               "data.sampler=global"}));
  EXPECT_EQ(other.exit_code, 2) << other.err;
  expect_contains(other.err, "data.sampler");
  auto resumed = test::run_command(with(small_run(d, "old", 1), {"--set", "run.dir=" + (d / "moved")}));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  expect_contains(resumed.out + resumed.err, "resumed from");
}

// The default job on 2 ranks trains as it does in one process (label slow, the longest test):
// 128 steps of the default recipe (bf16, channels_last, AdamW one-cycle, flips, dropout,
// label smoothing) on 32,768 samples, one process × batch 256 against `crucible launch
// --nproc 2` × 128 with dist.bn = sync, so every step sees the same 256 samples and the same
// BatchNorm statistics. The runs differ only by rounding (reduction order), which bf16 and
// AdamW turn into small weight differences (measured here: up to 3% in one interval's mean
// loss, 0.1–0.3 points of final accuracy); the training loss of every log interval must agree
// within 5% and the final test accuracy within 1 point. The default job's full 10 epochs (≥ 91%) is `make demo`'s
// check and bench/fmnist_vs_pytorch's, where time is reported, not judged (issue 10).
TEST(TrainCliSlow, TwoRanksTrainTheDefaultRecipeAsOneProcess) {
  test::TempDir d;
  const std::vector<std::string> job = {"--set", "run.dir=" + d.path(), "--set", "data.train_samples=32768",
                                        "--set", "data.test_samples=5000", "--set", "train.epochs=1",
                                        "--set", "dist.bn=sync", "--set", "log.every_steps=16"};
  std::vector<std::string> one = {test::crucible_binary(), "train", "--set", "run.name=one"};
  one.insert(one.end(), job.begin(), job.end());
  std::vector<std::string> two = {test::crucible_binary(), "launch", "--nproc", "2", "--", "crucible", "train",
                                  "--set", "run.name=two", "--set", "train.batch_size=128"};
  two.insert(two.end(), job.begin(), job.end());
  auto r1 = test::run_command(one);
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = test::run_command(two);
  ASSERT_EQ(r2.exit_code, 0) << r2.out << r2.err;
  const json s1 = read_json(d / "one/summary.json"), s2 = read_json(d / "two/summary.json");
  EXPECT_EQ(s1["world_size"], 1);
  EXPECT_EQ(s2["world_size"], 2);
  EXPECT_EQ(s1["steps"], 128);
  EXPECT_EQ(s2["steps"], 128);
  EXPECT_EQ(s1["samples"], s2["samples"]);
  auto losses = [](const std::string& path) {
    std::vector<std::pair<int64_t, double>> out;
    std::istringstream lines(test::read_text(path));
    for (std::string line; std::getline(lines, line);) {
      const json j = json::parse(line);
      if (j["type"] == "train") out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    }
    return out;
  };
  const auto l1 = losses(d / "one/metrics.jsonl"), l2 = losses(d / "two/metrics.jsonl");
  ASSERT_EQ(l1.size(), 8u);
  ASSERT_EQ(l2.size(), l1.size());
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_EQ(l1[i].first, l2[i].first);
    EXPECT_NEAR(l2[i].second, l1[i].second, 0.05 * l1[i].second) << "training loss at step " << l1[i].first;
  }
  const double a1 = s1["test_acc"], a2 = s2["test_acc"];
  std::printf("128 steps: 1 process test_acc %.4f (%.1f s), 2 ranks %.4f (%.1f s); loss at step 128: %.4f vs %.4f\n",
              a1, s1["train_seconds"].get<double>(), a2, s2["train_seconds"].get<double>(), l1.back().second,
              l2.back().second);
  EXPECT_GT(a1, 0.85);
  EXPECT_NEAR(a2, a1, 0.01);
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// The threads of a running process by name (/proc/PID/task/*/comm); empty once it has gone.
std::map<std::string, int> threads_by_name(int pid) {
  std::map<std::string, int> names;
  std::error_code ec;
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::ifstream comm(it->path() / "comm");
    std::string name;
    if (std::getline(comm, name)) ++names[name];
  }
  return names;
}

// D7: the loader's threads never start threads of their own — no decoder thread, no torch
// intra-op (OpenMP) team. A thread takes its creator's name on Linux, so a team started from a
// loader thread would show up as more "crucible-load" threads than the loaders' pools hold
// (data.threads each for training and evaluation). Sampled from /proc while a run decodes
// JPEGs with 3 loader threads and 2 torch threads; torch's own threads (started by the main
// thread) are there too, under the main thread's name.
TEST(TrainCli, LoaderThreadsStartNoThreadsOfTheirOwnD7) {
  test::TempDir d;
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(5)\n"
                   "for split, n in (('train', 96), ('test', 32)):\n"
                   "    for i in range(n):\n"
                   "        c = i % 2; dd = os.path.join('" + d.path() + "', split, 'class%d' % c); os.makedirs(dd, exist_ok=True)\n"
                   "        a = np.full((96, 80, 3), 40 + 160 * c, np.uint8) + rng.integers(0, 30, (96, 80, 3), dtype=np.uint8)\n"
                   "        Image.fromarray(a).save(os.path.join(dd, '%03d.jpg' % i), quality=90)\n");
  ::setenv("CRUCIBLE_TEST_SAMPLE_DELAY_MS", "3", 1);  // a run long enough to watch
  test::Child run({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set", "run.name=threads",
                   "--set", "data.dataset=images", "--set", "data.train_path=" + (d / "train"), "--set",
                   "data.test_path=" + (d / "test"), "--set", "data.crop=24", "--set", "data.mean=[0.5, 0.5, 0.5]",
                   "--set", "data.std=[0.25, 0.25, 0.25]", "--set", "data.threads=3", "--set", "train.threads=2",
                   "--set", "train.epochs=3", "--set", "train.batch_size=16", "--set", "train.eval_batch_size=16"},
                  d.path());
  ::unsetenv("CRUCIBLE_TEST_SAMPLE_DELAY_MS");
  std::map<std::string, int> most;
  int samples = 0;
  while (run.running()) {
    const auto now = threads_by_name(run.pid());
    for (const auto& [name, n] : now) most[name] = std::max(most[name], n);
    samples += now.count("crucible-load") > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(run.wait(), 0) << run.err();
  std::string seen;
  for (const auto& [name, n] : most) seen += fmt::format("{} × {}; ", name, n);
  std::printf("threads seen: %s (%d samples)\n", seen.c_str(), samples);
  EXPECT_GT(samples, 20) << "the loader was not watched while it ran: " << seen;
  // The training and the evaluation pools, nothing more. (The main thread's own threads —
  // torch's team, its inter-op pool, crucible's writers — vary with what torch starts lazily.)
  EXPECT_EQ(most["crucible-load"], 2 * 3) << seen;
}

// The trainer on encoded images (data.dataset = "images"): an ImageFolder of PNGs and JPEGs,
// RandomResizedCrop to 16×16, 3-channel normalisation in RGB order (D3, D4).
TEST(TrainCli, TrainsOnAnImageFolder) {
  test::TempDir d;
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "rng = np.random.default_rng(2)\n"
                   "for split, n in (('train', 64), ('test', 16)):\n"
                   "    for i in range(n):\n"
                   "        c = i % 2; dd = os.path.join('" + d.path() + "', split, 'class%d' % c); os.makedirs(dd, exist_ok=True)\n"
                   "        a = np.full((24, 20, 3), 40 + 160 * c, np.uint8) + rng.integers(0, 30, (24, 20, 3), dtype=np.uint8)\n"
                   "        Image.fromarray(a).save(os.path.join(dd, '%03d.%s' % (i, 'png' if i % 2 else 'jpg')))\n");
  auto r = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set",
                              "run.name=img", "--set", "data.dataset=images", "--set",
                              "data.train_path=" + (d / "train"), "--set", "data.test_path=" + (d / "test"), "--set",
                              "data.crop=16", "--set", "data.mean=[0.5, 0.5, 0.5]", "--set",
                              "data.std=[0.25, 0.25, 0.25]", "--set", "data.eval_crop=16", "--set", "data.eval_resize=20",
                              "--set", "train.epochs=2", "--set", "train.batch_size=16",
                              "--set", "train.eval_batch_size=16", "--set", "schedule.warmup=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json s = read_json(d / "img/summary.json");
  EXPECT_EQ(s["samples"], 128);
  EXPECT_GE(s["test_acc"].get<double>(), 0.9);  // two classes of very different brightness
  // FixRes keys: the evaluation resizes the short side to data.eval_resize, not int(16 / 0.875) = 18.
  expect_contains(r.err + r.out, "short side to 20, as torchvision's Resize(20)");
  EXPECT_EQ(s["test_top5"].get<double>(), 1.0);  // X5: top-k with k = min(5, 2 classes) = 2: every sample
  // D3: mean/std listed in BGR order for RGB images is refused before training.
  auto bad = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set",
                                "run.name=bgr", "--set", "data.dataset=images", "--set",
                                "data.train_path=" + (d / "train"), "--set", "data.test_path=" + (d / "test"), "--set",
                                "data.crop=16", "--set", "data.mean=[0.5, 0.5, 0.5]", "--set",
                                "data.std=[0.25, 0.25, 0.25]", "--set", "data.mean_std_order=BGR"});
  EXPECT_EQ(bad.exit_code, 2);
  expect_contains(bad.err, "BGR");
  // D4: the default data.mean/data.std (one value, Fashion-MNIST's) on RGB photos is refused at
  // start-up, not spread over the 3 channels.
  auto one = test::run_command({test::crucible_binary(), "train", "--set", "run.dir=" + d.path(), "--set",
                                "run.name=onevalue", "--set", "data.dataset=images", "--set",
                                "data.train_path=" + (d / "train"), "--set", "data.test_path=" + (d / "test"), "--set",
                                "data.crop=16"});
  EXPECT_EQ(one.exit_code, 2) << one.out << one.err;
  for (const char* m : {"data.mean has 1 value(s) and data.std has 1", "3 channel(s)",
                        "set data.mean and data.std to 3 value(s) each", "data.mean = [0.485, 0.456, 0.406]"}) {
    expect_contains(one.err, m);
  }
  EXPECT_FALSE(fs::exists(d / "onevalue/checkpoints/ckpt-000000001.safetensors"));
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// Non-finite training: steps are skipped, then after train.max_bad_steps in a row the run
// exits 3 naming the step and the tensor, and the last checkpoint holds finite weights.
TEST(TrainCli, DivergenceExitsThreeNamingStepAndTensor) {
  test::TempDir d;
  auto r = test::run_command(with(small_run(d, "boom", 1), {"--set", "optim.lr=1e12", "--set", "schedule.name=constant",
                                                            "--set", "train.max_bad_steps=2", "--set",
                                                            "checkpoint.every_steps=1"}));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  expect_contains(r.err, "training diverged");
  expect_contains(r.err, "is not finite at step");
  expect_contains(r.err, "step skipped");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("(the loss|the gradient of [\\w.]+) is not finite at step (\\d+)")))
      << r.err;
  const auto steps = checkpoint_steps(d / "boom");
  ASSERT_FALSE(steps.empty());
  char name[64];
  std::snprintf(name, sizeof(name), "/checkpoints/ckpt-%09lld.safetensors", static_cast<long long>(steps.back()));
  auto inspect = test::run_command({test::crucible_binary(), "inspect", d / "boom" + name, "--stats", "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  for (const auto& a : json::parse(inspect.out)["arrays"]) {
    if (a["name"].get<std::string>().rfind("model.", 0) != 0 || a["stats"].is_null()) continue;
    EXPECT_EQ(a["stats"]["nan"], 0) << a["name"];
    EXPECT_EQ(a["stats"]["inf"], 0) << a["name"];
  }
}

// M5 / T4 / T7 and clipping, checked on what the run did: the lr of every logged step is the
// schedule's at the scaled peak (lr_per_256 × 128 / 256), and the global gradient norm the
// optimizer saw never exceeded train.clip_norm although the raw norm did (metrics.jsonl). That
// accumulation gives the whole batch's gradient is Step.AccumulatedMicroBatchesGive… (M5).
TEST(TrainCli, LrScalingClippingAndAccumulationAreApplied) {
  test::TempDir d;
  const double clip = 0.25;
  auto r = test::run_command(with(small_run(d, "acc", 1), {"--set", "train.accumulate=4", "--set",
                                                           "optim.lr_per_256=0.001", "--set", "train.clip_norm=0.25",
                                                           "--set", "log.every_steps=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "(4 micro-batches)");
  expect_contains(r.out, "parameter groups (T4): 6 tensors with weight decay 0.0005, 10 biases/norm weights with 0");
  const train::Schedule schedule(train::ScheduleOptions{}, 0.001 * 128 / 256, 0.9, kStepsPerEpoch);
  int records = 0, clipped = 0;
  std::istringstream lines(test::read_text(d / "acc/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (j["type"] != "train") continue;
    ++records;
    const int64_t step = j["step"];  // logged after step `step` ran with the schedule's point step - 1
    EXPECT_NEAR(j["lr"].get<double>(), schedule.at(step - 1).lr, 1e-12) << "step " << step;
    EXPECT_LE(j["grad_norm_max_clipped"].get<double>(), clip * (1 + 1e-4)) << "step " << step;
    if (j["grad_norm_max"].get<double>() > clip * 1.01) ++clipped;
  }
  EXPECT_EQ(records, kStepsPerEpoch);
  EXPECT_GT(clipped, 0) << "the raw gradient norm never exceeded " << clip << ": clipping was not exercised";
  EXPECT_GT(read_json(d / "acc/summary.json")["test_acc"].get<double>(), 0.5);
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// T17: the batch found fits the budget and the next one up was tried and did not.
TEST(TrainCli, TuneBatchFindsTheLargestThatFits) {
  auto r = test::run_command({test::crucible_binary(), "tune", "batch", "--budget-mb", "120", "--max", "2048", "--json",
                              "--set", "data.train_samples=4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out.substr(r.out.rfind('{')));
  const int64_t b = j["batch"];
  EXPECT_GT(b, 1);
  EXPECT_LT(b, 2048);
  EXPECT_LE(j["peak_bytes"].get<int64_t>(), int64_t{120} << 20);
  expect_contains(r.out, "batch " + std::string(6 - std::min<size_t>(6, std::to_string(b + 1).size()), ' ') +
                             std::to_string(b + 1) + ": out of memory");
  EXPECT_EQ(test::run_command({test::crucible_binary(), "tune", "batch"}).exit_code, 2);  // CPU needs a budget
}

// T1: with loss scaling on, the scale and its growth counter survive a kill and resume. The
// scale grows every 6 clean steps and checkpoints fall every 5, so the checkpoint resumed from
// (asserted) holds a counter that is not 0: a resume that dropped it would grow the scale at
// other steps and end with another counter.
TEST(TrainCli, LossScaleSurvivesAResumeT1) {
  test::TempDir d;
  const std::initializer_list<std::string> scaling = {"--set", "train.loss_scaling=on", "--set",
                                                      "train.loss_scale_interval=6"};
  auto ref = test::run_command(with(small_run(d, "plain"), scaling));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const json want = read_json(d / "plain/summary.json");
  EXPECT_GT(want["loss_scale"].get<double>(), 65536.0);  // it grew every 6 clean steps
  const int64_t killed_at = [&] {
    test::Child child(with(small_run(d, "killed"), scaling), d.path());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < deadline && child.running()) {
      auto steps = checkpoint_steps(d / "killed");
      if (!steps.empty() && steps.back() > kStepsPerEpoch && steps.back() < 2 * kStepsPerEpoch - 5) {
        child.kill(SIGKILL);
        child.wait();
        return steps.back();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return int64_t{-1};
  }();
  ASSERT_GT(killed_at, kStepsPerEpoch) << "no second-epoch checkpoint before the run ended";
  char name[64];
  std::snprintf(name, sizeof(name), "/checkpoints/ckpt-%09lld.safetensors", static_cast<long long>(killed_at));
  auto inspect = test::run_command({test::crucible_binary(), "inspect", d / "killed" + name, "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const json meta = json::parse(inspect.out)["metadata"];
  EXPECT_NE(meta["loss_scale_tracker"], "0") << "checkpoint at step " << killed_at;
  EXPECT_EQ(meta["loss_scale_tracker"], std::to_string(killed_at % 6));
  auto resumed = test::run_command(with(small_run(d, "killed"), scaling));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const json got = read_json(d / "killed/summary.json");
  EXPECT_EQ(got["resumed_from_step"], killed_at);
  EXPECT_EQ(got["loss_scale"], want["loss_scale"]);
  EXPECT_EQ(got["loss_scale_growth_tracker"], want["loss_scale_growth_tracker"]);
  EXPECT_EQ(got["params_sha256"], want["params_sha256"]);
}

}  // namespace
}  // namespace crucible
