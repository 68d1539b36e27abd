// Test helpers: TempDir, posix_spawn-based process running.
#include "test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace crucible::test {
namespace fs = std::filesystem;

SmallDisk::SmallDisk(std::string path, int mib) : path_(std::move(path)) {
  std::filesystem::create_directories(path_);
  const std::string options = "size=" + std::to_string(mib) + "m";
  if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
    mounted_ = true;
  } else {
    why_not_ = "cannot mount a tmpfs at " + path_ + " (" + std::strerror(errno) + "): the full-disk test needs root";
  }
}

SmallDisk::~SmallDisk() {
  if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
}

void SmallDisk::resize(int mib) {
  const std::string options = "size=" + std::to_string(mib) + "m";
  if (::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT, options.c_str()) != 0) {
    throw std::runtime_error("cannot remount " + path_ + ": " + std::strerror(errno));
  }
}

void fill_disk(const std::string& dir, const std::string& name, int64_t leave_bytes) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) throw std::runtime_error("statvfs " + dir);
  const int64_t free = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  std::ofstream out(dir + "/" + name, std::ios::binary);
  const std::string block(1 << 16, '\0');
  for (int64_t left = free - leave_bytes; left > 0; left -= static_cast<int64_t>(block.size())) {
    out.write(block.data(), static_cast<std::streamsize>(std::min<int64_t>(left, static_cast<int64_t>(block.size()))));
  }
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "crucible-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

namespace {

int spawn(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
          const std::string& cwd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // posix_spawn has no chdir before glibc 2.29's _np extension; use it when asked.
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  return pid;
}

int decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, const std::string& cwd) {
  TempDir logs;
  const auto t0 = std::chrono::steady_clock::now();
  Child c(argv, logs.path(), cwd);
  CommandResult r;
  r.exit_code = c.wait();
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.max_rss_kb = c.max_rss_kb();
  r.out = c.out();
  r.err = c.err();
  return r;
}

Child::Child(const std::vector<std::string>& argv, const std::string& log_dir, const std::string& cwd) {
  static int counter = 0;
  ++counter;
  out_path_ = log_dir + "/child" + std::to_string(counter) + ".out";
  err_path_ = log_dir + "/child" + std::to_string(counter) + ".err";
  pid_ = spawn(argv, out_path_, err_path_, cwd);
}

Child::~Child() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

void Child::kill(int sig) {
  if (pid_ > 0 && status_ < 0) ::kill(pid_, sig);
}

int Child::wait() {
  if (status_ >= 0) return decode(status_);
  int st = 0;
  struct rusage ru {};
  while (::wait4(pid_, &st, 0, &ru) < 0) {
  }
  status_ = st;
  max_rss_kb_ = ru.ru_maxrss;
  return decode(st);
}

bool Child::running() {
  if (status_ >= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = st;
    return false;
  }
  return true;
}

std::string Child::out() const { return read_text(out_path_); }
std::string Child::err() const { return read_text(err_path_); }

std::string oracle_python() {
#ifdef CRUCIBLE_TEST_ORACLE_PYTHON
  return CRUCIBLE_TEST_ORACLE_PYTHON;
#else
  return kPython;
#endif
}

namespace {
// "" when `from torchvision.transforms import v2` works and has MixUp, else what went wrong.
const std::string& v2_import_error() {
  static const std::string error = [] {
    const std::string out = run_python(
        "try:\n"
        "    from torchvision.transforms import v2\n"
        "    print('ok' if hasattr(v2, 'MixUp') else 'torchvision.transforms.v2 has no MixUp')\n"
        "except ImportError as e:\n"
        "    print(repr(e))\n");
    const std::string line = out.substr(0, out.find('\n'));
    return line == "ok" ? std::string() : line;
  }();
  return error;
}
}  // namespace

bool oracle_has_transforms_v2() { return v2_import_error().empty(); }
std::string oracle_v2_missing() { return v2_import_error(); }

bool oracles_required() {
#ifdef CRUCIBLE_TEST_REQUIRE_ORACLES
  return true;
#else
  return false;
#endif
}

std::string run_python_in(const std::string& python, const std::string& script) {
  TempDir dir;
  write_text(dir / "oracle.py", script);
  CommandResult r = run_command({python, dir / "oracle.py"});
  if (r.exit_code != 0) {
    throw std::runtime_error(python + " failed (exit " + std::to_string(r.exit_code) + "):\n" + r.err);
  }
  return r.out;
}

std::string run_python(const std::string& script) { return run_python_in(oracle_python(), script); }

std::string python_read_safetensors(const std::string& path) {
  return "import json, struct, numpy as np\n"
         "b = open('" + path + "', 'rb').read()\n"
         "n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])\n";
}

std::string crucible_binary() {
#ifdef CRUCIBLE_BINARY
  return CRUCIBLE_BINARY;
#else
  const char* p = std::getenv("CRUCIBLE_BINARY");
  return p != nullptr ? p : "crucible";
#endif
}

std::vector<std::string> launched(int nproc, const std::vector<std::string>& cmd) {
  std::vector<std::string> l = {crucible_binary(), "launch", "--nproc", std::to_string(nproc), "--"};
  l.insert(l.end(), cmd.begin(), cmd.end());
  return l;
}

std::vector<std::pair<int64_t, int64_t>> read_step_trace(const std::string& prefix, int rank) {
  std::vector<std::pair<int64_t, int64_t>> steps;
  std::istringstream lines(read_text(prefix + ".rank" + std::to_string(rank)));
  int64_t step = 0, size = 0;
  while (lines >> step >> size) steps.emplace_back(step, size);
  return steps;
}

nlohmann::json read_tfevents(const std::string& dir) {
  return nlohmann::json::parse(run_python_in(kPython, "import runpy, sys\n"
                                          "sys.argv = ['read_tfevents.py', '" + dir + "']\n"
                                          "runpy.run_path('" CRUCIBLE_TEST_SUPPORT_DIR
                                          "/read_tfevents.py', run_name='__main__')\n"));
}

void expect_epoch_ends_released(const nlohmann::json& on, const nlohmann::json& off, int64_t at_least) {
  const nlohmann::json& m = on["epoch_end_memory"];
  ASSERT_EQ(m["released_bytes"].size(), 2u) << m.dump();
  ASSERT_EQ(m["held_bytes"].size(), 2u);
  ASSERT_EQ(off["epoch_end_memory"]["held_bytes"].size(), 2u);
  EXPECT_TRUE(off["epoch_end_memory"]["released_bytes"].empty());
  constexpr int64_t kMiB = 1 << 20;
  for (size_t e = 0; e < 2; ++e) {
    const int64_t released = m["released_bytes"][e], held = m["held_bytes"][e];
    const int64_t kept = off["epoch_end_memory"]["held_bytes"][e];
    std::printf("epoch %zu end: released %lld MiB, holding %lld MiB (without the release: %lld MiB)\n", e + 1,
                static_cast<long long>(released / kMiB), static_cast<long long>(held / kMiB),
                static_cast<long long>(kept / kMiB));
    EXPECT_GE(released, at_least) << m.dump();
    EXPECT_LE(held + at_least, kept) << m.dump() << off["epoch_end_memory"].dump();
  }
  EXPECT_EQ(on["params_sha256"], off["params_sha256"]);
}

}  // namespace crucible::test
