// Helpers shared by crucible's tests: temporary folders, running a program (the crucible
// binary, a Python with torch and torchvision as an oracle) and capturing its output. Torch-free.
#pragma once

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/data/transforms/sample_transform.h"

namespace crucible::test {

// A fresh folder under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tmpfs of `mib` MiB mounted at `path` (created) for full-disk tests; unmounted when it goes.
// Needs root (tests run as root): mounted() is false otherwise, and the caller skips, saying why.
class SmallDisk {
 public:
  SmallDisk(std::string path, int mib);
  ~SmallDisk();
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }
  void resize(int mib);  // remount with another size (files kept)
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string why_not_;
};

// Fills the file system of `dir` with a file `name` until `leave_bytes` are free (about).
void fill_disk(const std::string& dir, const std::string& name, int64_t leave_bytes);

struct CommandResult {
  int exit_code = -1;  // exit status, or 128 + signal
  std::string out;     // stdout
  std::string err;     // stderr
  int64_t max_rss_kb = 0;      // the child's peak resident memory (getrusage via wait4)
  double wall_seconds = 0;     // start to exit
};

// Runs argv[0] (searched in PATH) with argv, waits, returns its exit code and output.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& cwd = "");

// A child process started in the background (stdout/stderr to files in `log_dir`).
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log_dir, const std::string& cwd = "");
  ~Child();  // kills and reaps if still running
  void kill(int sig = SIGKILL);
  // Waits for exit; returns exit code or 128 + signal.
  int wait();
  int64_t max_rss_kb() const { return max_rss_kb_; }  // after wait()
  int pid() const { return pid_; }
  bool running();
  std::string out() const;
  std::string err() const;

 private:
  int pid_ = -1;
  int status_ = -1;
  int64_t max_rss_kb_ = 0;
  std::string out_path_, err_path_;
};

// Debian's python, never a python earlier on PATH: numpy, torch 1.13, torchvision 0.14, PIL, and
// the tools tests use (protobuf and crc32c for TensorBoard files).
constexpr const char* kPython = "/usr/bin/python3";

// The Python whose torch and torchvision are the oracle: in a build against torch 2.x (make
// test-torch2) its venv's (torchvision with transforms.v2), else Debian's (kPython).
std::string oracle_python();
// Whether the oracle has torchvision.transforms.v2 (MixUp, CutMix, RandomErasing); when not,
// oracle_v2_missing() says why (the import's error).
bool oracle_has_transforms_v2();
std::string oracle_v2_missing();
// Whether this build must have its oracles (the build against torch 2.x, make test-torch2): a
// comparison whose oracle is missing then fails instead of skipping (issue 46). make test counts
// and prints the skips (scripts/count-skips).
bool oracles_required();

// At the top of a test that compares with torchvision.transforms.v2: skips without it (make
// test, Debian's torchvision 0.14), fails naming the import error where oracles are required.
#define CRUCIBLE_NEEDS_TRANSFORMS_V2(what)                                                                       \
  if (!::crucible::test::oracle_has_transforms_v2()) {                                                           \
    if (::crucible::test::oracles_required()) {                                                                  \
      FAIL() << "the oracle torchvision.transforms.v2 cannot be imported by " << ::crucible::test::oracle_python() \
             << " (" << ::crucible::test::oracle_v2_missing() << "); " << (what)                                 \
             << " compares with it, and this build requires its oracles (make test-torch2)";                     \
    }                                                                                                            \
    GTEST_SKIP() << "the oracle is torchvision.transforms.v2, which " << ::crucible::test::oracle_python()         \
                 << "'s torchvision lacks (" << ::crucible::test::oracle_v2_missing() << "): " << (what)          \
                 << "; make test-torch2 runs it against the venv's";                                             \
  }

// Runs a Python script with the oracle Python (run_python) or another (run_python_in) and
// returns its stdout; fails the calling test (via exception) on a non-zero exit.
std::string run_python(const std::string& script);
std::string run_python_in(const std::string& python, const std::string& script);

std::string read_text(const std::string& path);

// The TensorBoard event files in `dir` as read by tests/support/read_tfevents.py (an independent
// reader: Debian's protobuf and crc32c), as its JSON object.
nlohmann::json read_tfevents(const std::string& dir);

// A training pipeline's transforms with only a random horizontal flip of probability p (none for 0).
inline data::SampleTransforms flip(float p) {
  if (p <= 0) return {};
  return {std::make_shared<data::RandomHorizontalFlip>(p)};
}
void write_text(const std::string& path, const std::string& text);

// Path of the crucible program under test (set by CMake).
std::string crucible_binary();

// `cmd` run on `nproc` local ranks: crucible launch --nproc N -- cmd….
std::vector<std::string> launched(int nproc, const std::vector<std::string>& cmd);

// What CRUCIBLE_TEST_STEP_TRACE=PREFIX left for `rank`: (step, input size) per training step.
std::vector<std::pair<int64_t, int64_t>> read_step_trace(const std::string& prefix, int rank);

// T13: two summaries of the same 2-epoch job, with train.release_cache on and off. Expects each
// epoch end to have released at least `at_least` bytes and to hold that much less than the run
// without the release, and equal weights.
void expect_epoch_ends_released(const nlohmann::json& on, const nlohmann::json& off, int64_t at_least);

// Python lines that read the safetensors file `path` into `b` (bytes), `n` (header length) and
// `h` (header dict); a tensor's bytes are then b[8+n+s:8+n+e] for h[name]['data_offsets'] = [s, e].
std::string python_read_safetensors(const std::string& path);

// Expects `needle` in `text`, printing the text when it is missing.
inline void expect_contains(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << text;
}

// Expects every one of `needles` in `text`.
inline void expect_contains(const std::string& text, std::initializer_list<const char*> needles) {
  for (const char* needle : needles) expect_contains(text, needle);
}

// Runs f and expects a crucible::Error of `kind` whose message contains every needle.
template <typename F>
void expect_error(ErrorKind kind, F f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind);
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// A bad-input error (exit 2) / a runtime error (exit 1) whose message contains every needle.
template <typename F>
void expect_bad_input(F f, std::initializer_list<const char*> needles) {
  expect_error(ErrorKind::kBadInput, f, needles);
}
template <typename F>
void expect_runtime_error(F f, std::initializer_list<const char*> needles) {
  expect_error(ErrorKind::kRuntime, f, needles);
}

}  // namespace crucible::test
