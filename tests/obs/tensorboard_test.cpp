// TensorBoard event files: CRC-32C against the published check values (RFC 3720 B.4 and the
// CRC catalogue's "123456789"); files read back by an independent reader (Debian's
// python3-protobuf and python3-crc32c, tests/support/read_tfevents.py) with the values written;
// a damaged record is named by file and offset; a torn last record (a crash mid-write) is
// dropped; truncation on resume keeps exactly the events at or before the step.
#include "crucible/obs/tensorboard.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/obs/jsonl.h"
#include "test_util.h"

namespace crucible::obs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<size_t>(i)] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(TensorBoard, AnIndependentReaderReadsBackWhatWasWritten) {
  test::TempDir d;
  const std::string dir = d / "tb";
  {
    EventWriter w(dir);
    w.scalar("train/loss", 5, 0.6931471805599453, 1.0e9);
    w.scalar("train/zero", 6, 0.0, 1.0e9);
    w.scalar("eval/test_acc", 10, 0.8125, 1.0e9);
    w.text("config", 0, "[model]\nname = \"fmnist_cnn\"\n", 1.0e9);
    Histogram h{-1.5, 2.5, 7, 3.25, 12.5, {-0.5, 0.5, 2.5}, {2, 1, 4}};
    w.histogram("weight/fc.weight", 10, h, 1.0e9);
    w.flush();
  }
  const json r = test::read_tfevents(dir);
  ASSERT_EQ(r["files"].size(), 1u);
  EXPECT_EQ(r["versions"], json::array({"brain.Event:2"}));
  ASSERT_EQ(r["scalars"].size(), 3u);
  EXPECT_EQ(r["scalars"][0], json::array({"train/loss", 5, static_cast<double>(0.6931471805599453f)}));
  EXPECT_EQ(r["scalars"][1], json::array({"train/zero", 6, 0.0}));
  EXPECT_EQ(r["scalars"][2], json::array({"eval/test_acc", 10, 0.8125}));
  ASSERT_EQ(r["texts"].size(), 1u);
  EXPECT_EQ(r["texts"][0], json::array({"config", 0, "[model]\nname = \"fmnist_cnn\"\n", "text"}));
  ASSERT_EQ(r["histograms"].size(), 1u);
  EXPECT_EQ(r["histograms"][0],
            json::parse(R"(["weight/fc.weight", 10, -1.5, 2.5, 7.0, 3.25, 12.5, [-0.5, 0.5, 2.5], [2.0, 1.0, 4.0]])"));

  // crucible's own reader agrees on the records and their steps.
  const auto records = read_event_records(event_files(dir)[0]);
  ASSERT_EQ(records.size(), 6u);
  std::vector<int64_t> steps;
  for (const auto& e : records) steps.push_back(event_step(e));
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 5, 6, 10, 0, 10}));
}

TEST(TensorBoard, HyperparametersAreTypedValuesForTheHParamsTab) {
  test::TempDir d;
  const std::string dir = d / "tb";
  {
    EventWriter w(dir);
    w.hparams_start({{"optim.lr", "0.002"}, {"model.name", "\"fmnist_cnn\""}, {"train.channels_last", "false"},
                     {"train.batch_size", "128"}, {"data.mean", "[0.286, 0.5]"}},
                    {"eval/test_acc"}, 20, 1.0e9);
    w.hparams_end(30, 1.5e9);
  }
  const json r = test::read_tfevents(dir);
  ASSERT_EQ(r["hparams"].size(), 3u) << r.dump();
  EXPECT_EQ(r["hparams"][0][0], "_hparams_/experiment");
  EXPECT_EQ(r["hparams"][0][1], 20);
  EXPECT_EQ(r["hparams"][0][2], json::parse(R"({"hparams": [["optim.lr", 3], ["model.name", 1],
      ["train.channels_last", 2], ["train.batch_size", 3], ["data.mean", 1]], "metrics": [["", "eval/test_acc", 2]]})"));
  EXPECT_EQ(r["hparams"][1][0], "_hparams_/session_start_info");
  EXPECT_EQ(r["hparams"][1][2], json::parse(R"({"values": {"optim.lr": 0.002, "model.name": "fmnist_cnn",
      "train.channels_last": false, "train.batch_size": 128.0, "data.mean": "[0.286, 0.5]"}, "start": 1.0e9})"));
  EXPECT_EQ(r["hparams"][2], json::parse(R"(["_hparams_/session_end_info", 30, {"status": 1, "end": 1.5e9}])"));
}

// A full disk: metrics.jsonl and a TensorBoard event file keep whole records only (the append
// that does not fit is cut back and throws, naming the file and the space), and an atomic
// file that does not fit fails before it writes a byte, leaving the old version. On a 1 MiB
// tmpfs filled to its last ~4 KiB.
TEST(FullDisk, AppendsStayWholeAndAtomicFilesKeepTheOldVersion) {
  test::TempDir d;
  test::SmallDisk disk(d / "disk", 1);
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  const std::string dir = disk.path();
  write_file_atomic(dir + "/summary.json", "old");
  JsonlWriter jsonl(dir + "/metrics.jsonl");
  jsonl.write(nlohmann::json{{"step", 1}});
  EventWriter events(dir + "/tb");
  events.scalar("train/loss", 1, 0.5, 1.0e9);
  events.flush();
  const std::string event_path = event_files(dir + "/tb")[0];
  const std::string jsonl_before = test::read_text(dir + "/metrics.jsonl");
  const std::string events_before = test::read_text(event_path);
  set_log_file(dir + "/train.log");
  log_info("before the disk filled");
  test::fill_disk(dir, "filler", 4096);
  const std::string big(64 * 1024, 'x');
  test::expect_runtime_error([&] { jsonl.write(nlohmann::json{{"step", 2}, {"note", big}}); },
                             {"metrics.jsonl", "No space left on device", "free on the file system of"});
  EXPECT_EQ(test::read_text(dir + "/metrics.jsonl"), jsonl_before);
  for (int s = 2; s < 200; ++s) events.text("train/note", s, big.substr(0, 2000), 1.0e9);
  test::expect_runtime_error([&] { events.flush(); }, {"events.out.tfevents.", "No space left on device"});
  EXPECT_EQ(test::read_text(event_path), events_before);
  EXPECT_EQ(read_event_records(event_path).size(), 2u);  // the file version and step 1's scalar
  test::expect_runtime_error([&] { write_file_atomic(dir + "/summary.json", big + big); },
                             {"summary.json", "No space left on device", "the file needs 128 KiB"});
  EXPECT_EQ(test::read_text(dir + "/summary.json"), "old");
  log_info("{}", big);  // does not fit: train.log keeps its whole lines, and is not written again
  log_info("after");
  set_log_file("");
  EXPECT_EQ(test::read_text(dir + "/train.log"), "before the disk filled\n");
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos);
}

TEST(TensorBoard, ADamagedRecordIsNamedByFileAndOffsetATornTailIsDropped) {
  test::TempDir d;
  const std::string dir = d / "tb";
  {
    EventWriter w(dir);
    for (int s = 1; s <= 3; ++s) w.scalar("train/loss", s, 1.0 / s, 1.0e9);
  }
  const std::string path = event_files(dir)[0];
  const std::string good = test::read_text(path);

  // A crash mid-write: the header and half the payload of a copy of the last record.
  const size_t payload = read_event_records(path).back().size();
  {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f << good.substr(good.size() - (16 + payload), 12 + payload / 2);
  }
  bool torn = false;
  EXPECT_EQ(read_event_records(path, &torn).size(), 4u);
  EXPECT_TRUE(torn);
  truncate_events(dir, 100);  // rewrites without the torn tail
  EXPECT_EQ(test::read_text(path), good);
  EXPECT_NO_THROW(test::read_tfevents(dir));

  // One flipped bit in the last record's payload.
  std::string bad = good;
  bad[bad.size() - 6] ^= 0x01;
  test::write_text(path, bad);
  test::expect_bad_input([&] { read_event_records(path); }, {"events.out.tfevents.", "CRC-32C does not match", "byte "});
  EXPECT_ANY_THROW(test::read_tfevents(dir));  // the independent reader refuses it too
}

TEST(TensorBoard, TruncationKeepsTheEventsUpToTheResumedStep) {
  test::TempDir d;
  const std::string dir = d / "tb";
  {
    EventWriter w(dir);
    w.text("config", 0, "a = 1\n", 1.0e9);
    for (int s = 1; s <= 10; ++s) w.scalar("train/loss", s, s, 1.0e9);
  }
  {
    EventWriter late(dir);  // a second session that wrote only past the checkpoint
    for (int s = 8; s <= 9; ++s) late.scalar("train/loss", s, s, 1.0e9);
  }
  ASSERT_EQ(event_files(dir).size(), 2u);
  truncate_events(dir, 6);
  const auto files = event_files(dir);
  ASSERT_EQ(files.size(), 1u) << "a file left with its version event alone is removed";
  std::vector<int64_t> steps;
  for (const auto& e : read_event_records(files[0])) steps.push_back(event_step(e));
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 5, 6}));
  const json r = test::read_tfevents(dir);
  EXPECT_EQ(r["texts"].size(), 1u);
  EXPECT_EQ(r["scalars"].size(), 6u);
}

}  // namespace
}  // namespace crucible::obs
