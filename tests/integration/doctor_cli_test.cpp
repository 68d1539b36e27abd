// `crucible doctor`: on the default job every check passes and exit is 0; compute threads beyond
// the cores fail the "cores" check with exit 1 and the count to set; a `ulimit -n` below what the
// loader will open (D6) fails "open_files" with exit 1 — and `crucible train` under the same
// limit does stop at start-up (exit 2), while one descriptor more passes both: doctor's verdict
// is the run's.
#include <gtest/gtest.h>

#include <sched.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;
using test::expect_contains;

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

std::map<std::string, json> checks_of(const std::string& out) {
  const json j = json::parse(out.substr(out.rfind("\n{") == std::string::npos ? 0 : out.rfind("\n{") + 1));
  std::map<std::string, json> by_name;
  for (const auto& c : j["checks"]) by_name[c["name"].get<std::string>()] = c;
  return by_name;
}

TEST(DoctorCli, TheDefaultJobPassesEveryCheck) {
  const auto r = test::run_command({test::crucible_binary(), "doctor", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto c = checks_of(r.out);
  for (const char* name : {"cores", "memory", "libtorch", "bf16", "cuda", "open_files", "data", "ram_cache"}) {
    ASSERT_EQ(c.count(name), 1u) << name << " missing in " << r.out;
    EXPECT_NE(c.at(name)["status"], "fail") << c.at(name).dump();
  }
  expect_contains(c.at("cores")["found"].get<std::string>(), std::to_string(cores()) + " core(s) available");
  expect_contains(c.at("data")["found"].get<std::string>(), "60000 training samples");
  expect_contains(c.at("bf16")["found"].get<std::string>(), "GFLOP/s");
}

TEST(DoctorCli, ThreadsBeyondTheCoresFailWithTheCountToSet) {
  const int n = cores();
  const auto r = test::run_command(
      {test::crucible_binary(), "doctor", "--json", "--set", "train.threads=" + std::to_string(4 * n)});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto c = checks_of(r.out);
  EXPECT_EQ(c.at("cores")["status"], "fail");
  expect_contains(c.at("cores")["fix"].get<std::string>(), "oversubscribe");
  expect_contains(c.at("cores")["fix"].get<std::string>(), "train.threads = " + std::to_string(n));
  // Two ranks on this machine at 0 threads share the cores: nothing to fix.
  const auto shared = test::run_command({test::crucible_binary(), "doctor", "--json", "--nproc", "2"});
  EXPECT_EQ(checks_of(shared.out).at("cores")["status"], n >= 2 ? "ok" : "fail") << shared.out;
}

// D6 with the image folder's readers (one file open per reader thread while it reads).
TEST(DoctorCli, AnOpenFileLimitBelowTheLoadersNeedFailsAsTheRunDoesD6) {
  test::TempDir d;
  test::run_python("import numpy as np, os\nfrom PIL import Image\n"
                   "for split in ('train', 'test'):\n"
                   "    for i in range(8):\n"
                   "        dd = os.path.join('" + d.path() + "', split, 'class%d' % (i % 2)); os.makedirs(dd, exist_ok=True)\n"
                   "        Image.fromarray(np.full((20, 20, 3), 30 * i, np.uint8)).save(os.path.join(dd, '%d.png' % i))\n");
  const std::string job = "--set run.dir=" + d.path() + " --set data.dataset=images --set data.train_path=" + (d / "train") +
                          " --set data.test_path=" + (d / "test") +
                          " --set data.crop=16 --set 'data.mean=[0.5,0.5,0.5]' --set 'data.std=[0.25,0.25,0.25]'"
                          " --set data.threads=40 --set train.epochs=1 --set train.batch_size=2 --set train.eval_batch_size=4"
                          " --set schedule.warmup=0.5 --set train.max_steps=1";
  // The soft limit only (a hard limit, once lowered, cannot be raised without root).
  auto under = [&](int limit, const std::string& sub) {
    return test::run_command({"/bin/bash", "-c",
                              (limit > 0 ? "ulimit -Sn " + std::to_string(limit) + " && " : std::string()) + "exec " +
                                  test::crucible_binary() + " " + sub + " " + job});
  };
  const auto ok = under(0, "doctor --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  const std::string found = checks_of(ok.out).at("open_files")["found"];
  const size_t at = found.find("needs about ");
  ASSERT_NE(at, std::string::npos) << found;
  const int need = std::stoi(found.substr(at + 12));
  EXPECT_GE(need, 40 + 64) << found;

  const auto low = under(need - 1, "doctor --json");
  EXPECT_EQ(low.exit_code, 1) << low.out << low.err;
  const auto c = checks_of(low.out);
  EXPECT_EQ(c.at("open_files")["status"], "fail");
  expect_contains(c.at("open_files")["fix"].get<std::string>(), "ulimit -n " + std::to_string(need));
  const auto train_low = under(need - 1, "train --set run.name=low");
  EXPECT_EQ(train_low.exit_code, 2) << "doctor said the run would fail:\n" << train_low.err;
  expect_contains(train_low.err, "ulimit -n");

  const auto enough = under(need, "doctor --json");
  EXPECT_EQ(checks_of(enough.out).at("open_files")["status"], "ok") << enough.out;
  const auto train_enough = under(need, "train --set run.name=enough");
  EXPECT_EQ(train_enough.exit_code, 0) << train_enough.err;
}

}  // namespace
}  // namespace crucible
