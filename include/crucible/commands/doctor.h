// `crucible doctor`: the checks every run records (train/doctor_checks.h), the bf16 matmul
// timed, and the job's data opened: the loader's open files against `ulimit -n` (D6), one
// thread's decoding rate, what a decoded RAM cache would take. Rank-free: run it on the machine
// that will train, with the job's config.
#pragma once

#include "crucible/train/doctor_checks.h"
#include "crucible/train/job_config.h"

namespace crucible::commands {

// `local_ranks`: processes that will share this machine (crucible launch --nproc; 1 alone).
train::DoctorReport run_doctor(const train::JobConfig& job, int local_ranks);

}  // namespace crucible::commands
