// The checks of the machine and the job that every run records (summary.json "doctor", the
// report's environment) and `crucible doctor` (commands/doctor.h) starts from: each check with a
// verdict, what it found and the fix. A check fails when it would make the run fail or waste
// most of its time; it warns when the run would work but worse. They measure nothing and open no
// data: milliseconds.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crucible/train/job_config.h"

namespace crucible::nn {
class Model;
}

namespace crucible::train {

class Optimizer;

struct DoctorCheck {
  enum class Status { kOk, kWarn, kFail };
  std::string name;   // "cores", "memory", "open_files", "libtorch", "bf16", "cuda", "data", "ram_cache"
  Status status = Status::kOk;
  std::string found;  // what was measured, in words
  std::string fix;    // what to change (empty when ok)
  nlohmann::json figures;  // the measured numbers, where a check has some (null otherwise)
};

struct DoctorReport {
  std::vector<DoctorCheck> checks;
  bool failed() const;
  std::string to_json() const;  // {"checks": [{"name", "status": "ok"|"warn"|"fail", "found", "fix"}], "failed"}
  std::string to_text() const;  // one line per check
};

// `local_ranks`: processes that will share this machine (crucible launch --nproc; 1 alone).
// The quick checks: cores, memory, libtorch, bf16 hardware from /proc/cpuinfo, CUDA.
DoctorReport run_doctor_quick(const JobConfig& job, int local_ranks);
// The checks as a JSON array text ([{"name", "status", "found", "fix"}, …]).
std::string doctor_checks_json(const DoctorReport& report);

// The bytes one checkpoint of this job takes, about: the model's parameters and buffers (twice
// with train.ema), the optimizer's state (SGD's momentum buffers, made at the first step,
// counted as one more copy of the parameters) and the header.
uint64_t checkpoint_bytes(const JobConfig& job, nn::Model& model, const Optimizer& optimizer);

// "disk": the space free where the run writes (run.dir) against checkpoint.keep checkpoints of
// `checkpoint` bytes, plus the one being written before the oldest goes, less the `kept` ones
// already there. Fails when not even one fits; warns, naming the keep that would fit, when the
// run would fill the disk.
DoctorCheck check_disk(const JobConfig& job, uint64_t checkpoint, int64_t kept);

// The single checks, for `crucible doctor`'s fuller list.
DoctorCheck doctor_check(const char* name);  // named, ok, nothing found yet
DoctorCheck check_cores(const JobConfig& job, int local_ranks);
DoctorCheck check_memory(int local_ranks);
DoctorCheck check_libtorch();
DoctorCheck check_cuda();

}  // namespace crucible::train
