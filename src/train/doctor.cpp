// `crucible doctor` (see doctor.h): each check measures one thing the run depends on.
#include "crucible/train/doctor.h"

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/loader.h"
#include "crucible/train/data_setup.h"

namespace crucible::train {
namespace {

using Clock = std::chrono::steady_clock;
using Status = DoctorCheck::Status;

DoctorCheck named(const char* name) {
  DoctorCheck c;
  c.name = name;
  return c;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string gib(double bytes) {
  return bytes < 1024.0 * 1024 * 1024 ? fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0))
                                      : fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kWarn: return "warn";
    case Status::kFail: return "fail";
  }
  return "?";
}

DoctorCheck check_cores(const JobConfig& job, int local_ranks) {
  DoctorCheck c = named("cores");
  const int cores = available_cores();
  const int threads = compute_threads(job, local_ranks);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  c.found = fmt::format("{} core(s) available to this process ({} on the machine); {} rank(s) × {} compute thread(s){}{}",
                        cores, std::thread::hardware_concurrency(), local_ranks, threads,
                        job.train.threads > 0 ? " (train.threads)" : " (train.threads = 0: the cores shared by the ranks)",
                        omp != nullptr ? fmt::format("; OMP_NUM_THREADS={} (crucible sets its own count)", omp) : "");
  if (static_cast<int64_t>(threads) * local_ranks > cores) {
    c.status = Status::kFail;
    c.fix = fmt::format("the compute threads ({} × {} = {}) oversubscribe the {} core(s): every step waits for threads "
                        "the kernel cannot run at once. Set train.threads = {} (or 0: chosen from the cores)",
                        local_ranks, threads, static_cast<int64_t>(threads) * local_ranks, cores,
                        std::max(1, cores / std::max(1, local_ranks)));
  }
  return c;
}

DoctorCheck check_memory(int local_ranks) {
  DoctorCheck c = named("memory");
  const uint64_t total = physical_memory_bytes(), avail = available_memory_bytes();
  struct statvfs shm {};
  const bool have_shm = ::statvfs("/dev/shm", &shm) == 0;
  const double shm_free = have_shm ? static_cast<double>(shm.f_bavail) * static_cast<double>(shm.f_frsize) : 0;
  c.found = fmt::format("{} available of {}; /dev/shm {}", gib(static_cast<double>(avail)), gib(static_cast<double>(total)),
                        have_shm ? gib(shm_free) + " free" : std::string("missing"));
  if (local_ranks > 1 && shm_free < 512.0 * 1024 * 1024) {
    c.status = Status::kWarn;
    c.fix = "data parallel on one machine passes tensors through /dev/shm: give it at least 512 MiB (in Docker: "
            "--shm-size=1g)";
  }
  if (avail > 0 && avail < 1024ull * 1024 * 1024) {
    c.status = Status::kWarn;
    c.fix = "less than 1 GiB of memory is available: close other programs or lower train.batch_size";
  }
  return c;
}

DoctorCheck check_open_files(const data::SamplePipeline& pipeline, int loader_threads, bool threads_chosen) {
  DoctorCheck c = named("open_files");
  struct rlimit lim {};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const int need = data::descriptors_needed(pipeline, loader_threads);
  const std::string limit = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(lim.rlim_cur);
  if (need == 0) {
    c.found = fmt::format("`ulimit -n` {}; the loader holds no files open ({})", limit, pipeline.describe());
    return c;
  }
  c.found = fmt::format("`ulimit -n` {}; the loader needs about {} ({} reader thread(s){} over {})", limit, need,
                        loader_threads, threads_chosen ? ", the most data.threads = 0 may choose" : "",
                        pipeline.describe());
  if (lim.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(need) > lim.rlim_cur) {
    c.status = Status::kFail;
    c.fix = fmt::format("the run would stop at start-up (D6): raise the limit (ulimit -n {}) or lower data.threads",
                        need);
  }
  return c;
}

DoctorCheck check_libtorch() {
  DoctorCheck c = named("libtorch");
  c.found = fmt::format("libtorch {}{}, oneDNN {}, {} compute thread(s) as the run sets them", compat::torch_version(),
                        compat::built_with_cuda() ? " (CUDA build)" : " (CPU build)",
                        at::hasMKLDNN() ? "yes" : "no", compat::num_threads());
  return c;
}

// GFLOP/s of a 512×512 matmul in `dtype` for about `seconds`.
double matmul_rate(c10::ScalarType dtype, double seconds) {
  at::NoGradGuard no_grad;
  const int64_t n = 512;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor out = at::mm(a, b);  // warm-up
  int64_t reps = 0;
  const auto t0 = Clock::now();
  double dt = 0;
  while ((dt = seconds_since(t0)) < seconds) {
    out = at::mm(a, b);
    ++reps;
  }
  return static_cast<double>(reps) * 2.0 * n * n * n / dt / 1e9;
}

DoctorCheck check_bf16(const JobConfig& job) {
  DoctorCheck c = named("bf16");
  const double fp32 = matmul_rate(at::kFloat, 1.0), bf16 = matmul_rate(at::kBFloat16, 1.0);
  c.found = fmt::format("matmul 512²: bf16 {:.0f} GFLOP/s, fp32 {:.0f} GFLOP/s ({:.2f}×)", bf16, fp32, bf16 / fp32);
  if (job.train.precision == PrecisionMode::kBf16 && bf16 < fp32) {
    c.status = Status::kWarn;
    c.fix = "this CPU computes bf16 slower than fp32: set train.precision = \"auto\" (times both) or \"fp32\"";
  }
  return c;
}

DoctorCheck check_cuda() {
  DoctorCheck c = named("cuda");
  const int devices = compat::cuda_device_count();
  c.found = compat::built_with_cuda() ? fmt::format("{} CUDA device(s)", devices)
                                      : std::string("this libtorch has no CUDA: training runs on the CPU");
  if (compat::built_with_cuda() && devices == 0) {
    c.status = Status::kWarn;
    c.fix = "a CUDA build sees no device: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES";
  }
  return c;
}

// Decoding rate on one thread for about `seconds`, and what caching the decoded set would take.
void check_data(const JobConfig& job, const data::SamplePipeline& train, double open_seconds, DoctorReport& report) {
  DoctorCheck d = named("data");
  const data::ImageSpec spec = train.output_spec();
  std::vector<uint8_t> sample(static_cast<size_t>(spec.bytes()));
  int64_t produced = 0;
  const auto t0 = Clock::now();
  double dt = 0;
  while ((dt = seconds_since(t0)) < 1.0 && train.size() > 0) {
    train.produce(produced % train.size(), 0, sample.data());
    ++produced;
  }
  const double rate = dt > 0 ? static_cast<double>(produced) / dt : 0;
  d.found = fmt::format("{} training samples of {} ({}), opened in {:.1f} s; one thread produces {:.0f} samples/s "
                        "({:.1f} MB/s of model input)",
                        train.size(), spec.to_string(), train.describe(), open_seconds, rate,
                        rate * static_cast<double>(spec.bytes()) / 1e6);
  report.checks.push_back(d);

  DoctorCheck r = named("ram_cache");
  const double decoded = static_cast<double>(train.size()) * static_cast<double>(spec.bytes());
  const double avail = static_cast<double>(available_memory_bytes());
  if (job.data.dataset != DataSection::Dataset::kImages) {
    r.found = fmt::format("the training set is in memory already ({} as model input)", gib(decoded));
  } else {
    r.found = fmt::format("decoded, the training set would take {} of the {} available", gib(decoded), gib(avail));
    if (avail > 0 && decoded > 0.5 * avail) {
      r.status = Status::kWarn;
      r.fix = "more than half the available memory: keep data.cache = \"none\" or \"encoded\", or pack the set smaller "
              "(crucible pack --max-side)";
    }
  }
  report.checks.push_back(r);
}

}  // namespace

bool DoctorReport::failed() const {
  return std::any_of(checks.begin(), checks.end(), [](const DoctorCheck& c) { return c.status == Status::kFail; });
}

std::string DoctorReport::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : checks) {
    out.push_back({{"name", c.name}, {"status", status_name(c.status)}, {"found", c.found}, {"fix", c.fix}});
  }
  return nlohmann::json{{"checks", out}, {"failed", failed()}}.dump();
}

std::string DoctorReport::to_text() const {
  std::string out;
  for (const auto& c : checks) {
    out += fmt::format("{:<4}  {:<10}  {}\n", status_name(c.status), c.name, c.found);
    if (!c.fix.empty()) out += fmt::format("      {:<10}  → {}\n", "", c.fix);
  }
  return out;
}

DoctorReport run_doctor_quick(const JobConfig& job, int local_ranks) {
  DoctorReport report;
  report.checks.push_back(check_cores(job, local_ranks));
  report.checks.push_back(check_memory(local_ranks));
  report.checks.push_back(check_libtorch());
  DoctorCheck bf16 = named("bf16");
  std::string flag;
  bf16.found = cpu_has_native_bf16(&flag)
                   ? fmt::format("this CPU computes bf16 in hardware ({}): precision = \"auto\" trains in bf16 here", flag)
                   : "no bf16 arithmetic on this CPU (no avx512_bf16, amx_bf16 or bf16 in /proc/cpuinfo): precision = "
                     "\"auto\" trains in fp32 here";
  report.checks.push_back(bf16);
  report.checks.push_back(check_cuda());
  return report;
}

std::string doctor_checks_json(const DoctorReport& report) {
  return nlohmann::json::parse(report.to_json())["checks"].dump();
}

DoctorReport run_doctor(const JobConfig& job, int local_ranks) {
  DoctorReport report;
  compat::set_num_threads(compute_threads(job, local_ranks));  // as the trainer does, for the timings
  report.checks.push_back(check_cores(job, local_ranks));
  report.checks.push_back(check_memory(local_ranks));
  report.checks.push_back(check_libtorch());
  report.checks.push_back(check_bf16(job));
  report.checks.push_back(check_cuda());
  const auto t0 = Clock::now();
  DataSetup ds;
  try {
    ds = make_data(job, derive_seed(static_cast<uint64_t>(job.run.seed), RngStream::kAugment));
  } catch (const Error& e) {
    report.checks.push_back({"data", Status::kFail, e.what(), "fix the data keys the message names"});
    return report;
  }
  const double open_seconds = seconds_since(t0);
  const int cores = std::max(1, available_cores() / std::max(1, local_ranks));
  const bool chosen = job.data.threads == 0;
  const int loader_threads = !chosen ? static_cast<int>(job.data.threads)
                             : job.data.dataset != DataSection::Dataset::kImages
                                 ? std::max(1, compute_threads(job, local_ranks) / 2)
                                 : cores;
  report.checks.push_back(check_open_files(*ds.train, loader_threads, chosen));
  check_data(job, *ds.train, open_seconds, report);
  return report;
}

}  // namespace crucible::train
