// `crucible doctor`: checks the machine and the job before a long run, each check with a
// verdict, what it found and the fix. A check fails when it would make the run fail or waste
// most of its time (threads oversubscribing the cores, a `ulimit -n` below what the loader will
// open); it warns when the run would work but worse. Rank-free: run it on the machine that will
// train, with the job's config.
#pragma once

#include <string>
#include <vector>

#include "crucible/train/job_config.h"

namespace crucible::train {

struct DoctorCheck {
  enum class Status { kOk, kWarn, kFail };
  std::string name;   // "cores", "memory", "open_files", "libtorch", "bf16", "cuda", "data", "ram_cache"
  Status status = Status::kOk;
  std::string found;  // what was measured, in words
  std::string fix;    // what to change (empty when ok)
};

struct DoctorReport {
  std::vector<DoctorCheck> checks;
  bool failed() const;
  std::string to_json() const;  // {"checks": [{"name", "status": "ok"|"warn"|"fail", "found", "fix"}], "failed"}
  std::string to_text() const;  // one line per check
};

// `local_ranks`: processes that will share this machine (crucible launch --nproc; 1 alone).
DoctorReport run_doctor(const JobConfig& job, int local_ranks);

// The checks that measure nothing and open no data (cores, memory, libtorch, bf16 hardware from
// /proc/cpuinfo, CUDA): milliseconds, so every run records them (summary.json "doctor", the
// report's environment).
DoctorReport run_doctor_quick(const JobConfig& job, int local_ranks);
// The checks as a JSON array text ([{"name", "status", "found", "fix"}, …]).
std::string doctor_checks_json(const DoctorReport& report);

}  // namespace crucible::train
