// The checks every run records (see doctor_checks.h).
#include "crucible/train/doctor_checks.h"

#include <sys/statvfs.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
#include "crucible/core/thread_pool.h"
#include "crucible/nn/model.h"
#include "crucible/train/ema_options.h"
#include "crucible/train/environment.h"
#include "crucible/train/optimizer.h"

namespace crucible::train {
namespace {

using Status = DoctorCheck::Status;

const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kWarn: return "warn";
    case Status::kFail: return "fail";
  }
  return "?";
}

}  // namespace

DoctorCheck doctor_check(const char* name) {
  DoctorCheck c;
  c.name = name;
  return c;
}

DoctorCheck check_cores(const JobConfig& job, int local_ranks) {
  DoctorCheck c = doctor_check("cores");
  const int cores = available_cores();
  const int threads = compute_threads(job, local_ranks);
  const std::string omp = read_environment().omp_num_threads;
  c.found = fmt::format("{} core(s) available to this process ({} on the machine); {} rank(s) × {} compute thread(s){}{}",
                        cores, std::thread::hardware_concurrency(), local_ranks, threads,
                        job.train.threads > 0 ? " (train.threads)" : " (train.threads = 0: the cores shared by the ranks)",
                        !omp.empty() ? fmt::format("; OMP_NUM_THREADS={} (crucible sets its own count)", omp) : "");
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
  DoctorCheck c = doctor_check("memory");
  const uint64_t total = physical_memory_bytes(), avail = available_memory_bytes();
  struct statvfs shm {};
  const bool have_shm = ::statvfs("/dev/shm", &shm) == 0;
  const double shm_free = have_shm ? static_cast<double>(shm.f_bavail) * static_cast<double>(shm.f_frsize) : 0;
  c.found = fmt::format("{} available of {}; /dev/shm {}", human_bytes(avail), human_bytes(total),
                        have_shm ? human_bytes(static_cast<uint64_t>(shm_free)) + " free" : std::string("missing"));
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

DoctorCheck check_libtorch() {
  DoctorCheck c = doctor_check("libtorch");
  c.found = fmt::format("libtorch {}{}, oneDNN {}, {} compute thread(s) as the run sets them", compat::torch_version(),
                        compat::built_with_cuda() ? " (CUDA build)" : " (CPU build)",
                        at::hasMKLDNN() ? "yes" : "no", compat::num_threads());
  return c;
}


DoctorCheck check_cuda() {
  DoctorCheck c = doctor_check("cuda");
  const int devices = compat::cuda_device_count();
  c.found = compat::built_with_cuda() ? fmt::format("{} CUDA device(s)", devices)
                                      : std::string("this libtorch has no CUDA: training runs on the CPU");
  if (compat::built_with_cuda() && devices == 0) {
    c.status = Status::kWarn;
    c.fix = "a CUDA build sees no device: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES";
  }
  return c;
}


uint64_t checkpoint_bytes(const JobConfig& job, nn::Model& model, const Optimizer& optimizer) {
  uint64_t weights = 0, params = 0, state = 0;
  for (const auto& t : model.named_parameters()) params += static_cast<uint64_t>(t.tensor.nbytes());
  weights = params;
  for (const auto& t : model.named_buffers()) weights += static_cast<uint64_t>(t.tensor.nbytes());
  for (const auto& t : optimizer.state()) state += t.tensor.defined() ? static_cast<uint64_t>(t.tensor.nbytes()) : 0;
  if (job.optim.name == "sgd" && job.optim.momentum > 0 && state == 0) state = params;  // made at the first step
  return weights * (job.pieces.get<EmaOptions>(kEmaPiece).enabled ? 2 : 1) + state + 64 * 1024;  // + the JSON header, generously
}

DoctorCheck check_disk(const JobConfig& job, uint64_t checkpoint, int64_t kept) {
  DoctorCheck c = doctor_check("disk");
  const std::string dir = job.run.dir;
  const int64_t free = free_bytes(dir);
  const int64_t keep = job.checkpoint.keep;
  const uint64_t need = checkpoint * static_cast<uint64_t>(std::max<int64_t>(1, keep + 1 - kept));
  c.found = fmt::format("{} free on the file system of {}; a checkpoint takes about {}, checkpoint.keep = {} ({} "
                        "there now)",
                        free >= 0 ? human_bytes(static_cast<uint64_t>(free)) : std::string("an unknown amount"), dir,
                        human_bytes(checkpoint), keep, kept);
  if (free < 0) return c;
  if (static_cast<uint64_t>(free) < checkpoint) {
    c.status = Status::kFail;
    c.fix = fmt::format("not even one checkpoint fits: free {} there, or set run.dir to a larger disk",
                        human_bytes(checkpoint - static_cast<uint64_t>(free)));
  } else if (static_cast<uint64_t>(free) < need) {
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(static_cast<uint64_t>(free) / checkpoint) + kept - 1);
    c.status = Status::kWarn;
    c.fix = fmt::format("checkpoint.keep = {} needs about {} (a new checkpoint is written before the oldest goes), "
                        "more than is free: the run would stop with the disk full (its newest checkpoint intact). Set "
                        "checkpoint.keep = {} or free {}",
                        keep, human_bytes(need), fit, human_bytes(need - static_cast<uint64_t>(free)));
  }
  return c;
}

bool DoctorReport::failed() const {
  return std::any_of(checks.begin(), checks.end(), [](const DoctorCheck& c) { return c.status == Status::kFail; });
}

std::string DoctorReport::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : checks) {
    out.push_back({{"name", c.name}, {"status", status_name(c.status)}, {"found", c.found}, {"fix", c.fix}});
    if (!c.figures.is_null()) out.back()["figures"] = c.figures;
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
  DoctorCheck bf16 = doctor_check("bf16");
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

}  // namespace crucible::train
