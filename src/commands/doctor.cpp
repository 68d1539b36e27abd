// `crucible doctor` (see doctor.h): each check measures one thing the run depends on.
#include "crucible/commands/doctor.h"

#include <sys/resource.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/loader/loader.h"
#include "crucible/nn/model.h"
#include "crucible/nn/model_options.h"
#include "crucible/data/data_setup.h"
#include "crucible/train/optimizer.h"
#include "crucible/train/step.h"

namespace crucible::commands {

using namespace crucible::train;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Status = DoctorCheck::Status;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

DoctorCheck check_open_files(const data::SamplePipeline& pipeline, int loader_threads, bool threads_chosen) {
  DoctorCheck c = doctor_check("open_files");
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
  DoctorCheck c = doctor_check("bf16");
  const double fp32 = matmul_rate(at::kFloat, 1.0), bf16 = matmul_rate(at::kBFloat16, 1.0);
  c.found = fmt::format("matmul 512²: bf16 {:.0f} GFLOP/s, fp32 {:.0f} GFLOP/s ({:.2f}×)", bf16, fp32, bf16 / fp32);
  if (job.train.precision == PrecisionMode::kBf16 && bf16 < fp32) {
    c.status = Status::kWarn;
    c.fix = "this CPU computes bf16 slower than fp32: set train.precision = \"auto\" (times both) or \"fp32\"";
  }
  return c;
}

// One thread produces samples of `p` for up to `seconds` (and at most one pass); what it read.
struct Produced {
  int64_t samples = 0;
  double seconds = 0;
  data::IoSnapshot io;
  int64_t cache_offered = 0;  // bytes the samples offered to the RAM cache take, kept or not
};
Produced produce_for(const data::SamplePipeline& p, double seconds) {
  Produced r;
  std::vector<uint8_t> sample(static_cast<size_t>(p.output_spec().bytes()));
  const data::IoSnapshot before = p.io();
  const int64_t offered = p.cache_offered_bytes();
  const auto t0 = Clock::now();
  while ((r.seconds = seconds_since(t0)) < seconds && r.samples < p.size()) {
    if (p.detection()) {
      p.produce_detection(r.samples, 0, nullptr);
    } else {
      p.produce(r.samples, 0, sample.data());
    }
    ++r.samples;
  }
  r.seconds = seconds_since(t0);
  r.io = p.io() - before;
  r.cache_offered = p.cache_offered_bytes() - offered;
  return r;
}

// D11: how fast one reader gets a split's files from storage, and what the RAM cache will hold.
// `figures` carries the numbers (doctor --json).
DoctorCheck check_io(const char* split, const data::SamplePipeline& p, const Produced& r) {
  DoctorCheck c;
  c.name = std::string("io_") + split;
  const data::IoSnapshot& io = r.io;
  const double files_per_s = r.seconds > 0 ? static_cast<double>(io.files) / r.seconds : 0;
  const double bytes_per_s = r.seconds > 0 ? static_cast<double>(io.bytes) / r.seconds : 0;
  const double ms_per_file = io.files > 0 ? 1e3 * io.read_seconds / static_cast<double>(io.files) : 0;
  c.figures = {{"split", split},           {"files", io.files},           {"bytes", io.bytes},
               {"seconds", r.seconds},     {"files_per_s", files_per_s},  {"bytes_per_s", bytes_per_s},
               {"ms_per_file", ms_per_file}, {"read_share", r.seconds > 0 ? io.read_seconds / r.seconds : 0.0},
               {"size", p.size()}};
  c.found = fmt::format(
      "{}: one thread read {} files ({}) in {:.2f} s while decoding them: {:.0f} files/s, {}/s; {:.3f} ms per read "
      "({:.0f}% of its time)",
      split, io.files, human_bytes(static_cast<uint64_t>(io.bytes)), r.seconds, files_per_s,
      human_bytes(static_cast<uint64_t>(bytes_per_s)), ms_per_file,
      r.seconds > 0 ? 100 * io.read_seconds / r.seconds : 0.0);
  if (io.files > 0 && r.seconds > 0 && io.read_seconds > 0.5 * r.seconds) {
    c.status = Status::kWarn;
    c.fix = "reading takes more than half the time: the storage is slow for these files (many small files on a "
            "network or spinning disk): pack them (crucible pack: page-aligned shards), or data.cache = \"encoded\"";
  }
  const std::string mode = p.cache_name();
  if (mode != "none" && io.cache_misses > 0) {
    // What a sample takes in the cache, times the split: does the budget hold it?
    const double needed =
        static_cast<double>(r.cache_offered) / static_cast<double>(io.cache_misses) * static_cast<double>(p.size());
    const double held = needed > 0 ? std::min(1.0, static_cast<double>(p.cache_budget_bytes()) / needed) : 1.0;
    c.figures["cache"] = {{"mode", mode},
                          {"budget_bytes", p.cache_budget_bytes()},
                          {"needed_bytes", needed},
                          {"expected_hit_rate", held}};
    c.found += fmt::format("; data.cache = \"{}\" needs about {} for all {} samples, the budget is {}: from the "
                           "second epoch on, {:.0f}% of reads hit the cache",
                           mode, human_bytes(static_cast<uint64_t>(needed)), p.size(),
                           human_bytes(static_cast<uint64_t>(p.cache_budget_bytes())), 100 * held);
    if (held < 1.0) {
      c.status = Status::kWarn;
      c.fix = fmt::format("raise data.cache_mb to {} to hold the whole split (samples past the budget are read "
                          "again every epoch)",
                          static_cast<int64_t>(needed / (1 << 20)) + 1);
    }
  }
  return c;
}

void check_data(const JobConfig& job, const data::SamplePipeline& train, double open_seconds, DoctorReport& report) {
  DoctorCheck d = doctor_check("data");
  const data::ImageSpec spec = train.output_spec();
  const Produced p = produce_for(train, 1.0);
  const int64_t produced = p.samples;
  const double dt = p.seconds;
  const double rate = dt > 0 ? static_cast<double>(produced) / dt : 0;
  d.found = fmt::format("{} training samples of {} ({}), opened in {:.1f} s; one thread produces {:.0f} samples/s "
                        "({:.1f} MB/s of model input)",
                        train.size(), spec.to_string(), train.describe(), open_seconds, rate,
                        rate * static_cast<double>(spec.bytes()) / 1e6);
  report.checks.push_back(d);
  report.checks.push_back(check_io("train", train, p));

  DoctorCheck r = doctor_check("ram_cache");
  const double decoded = static_cast<double>(train.size()) * static_cast<double>(spec.bytes());
  const double avail = static_cast<double>(available_memory_bytes());
  if (job.data.dataset != DataSection::Dataset::kImages) {
    r.found = fmt::format("the training set is in memory already ({} as model input)", human_bytes(static_cast<uint64_t>(decoded)));
  } else {
    r.found = fmt::format("decoded, the training set would take {} of the {} available", human_bytes(static_cast<uint64_t>(decoded)), human_bytes(static_cast<uint64_t>(avail)));
    if (avail > 0 && decoded > 0.5 * avail) {
      r.status = Status::kWarn;
      r.fix = "more than half the available memory: keep data.cache = \"none\" or \"encoded\", or pack the set smaller "
              "(crucible pack --max-side)";
    }
  }
  report.checks.push_back(r);
}


// Issue 37: remote data, after the data check has opened it and read samples (so its shards
// answered): what reading them cost, where the S3 credentials came from, and whether the cache
// folder's disk holds data.cache_bytes.
void check_remote(const JobConfig& job, const data::SamplePipeline& train, DoctorReport& report) {
  data::RemoteIo r;
  if (!train.remote_io(&r)) return;
  DoctorCheck c = doctor_check("remote");
  const int64_t free = free_bytes(r.cache_dir);
  c.found = fmt::format("{} answered: {} requests ({} retries), {:.1f} MB{}; shard cache {}: {} free for "
                        "data.cache_bytes = {} ({} held now)",
                        job.data.train_path, r.requests, r.retries, static_cast<double>(r.bytes) / 1e6,
                        r.credentials.empty() ? "" : "; credentials from " + r.credentials, r.cache_dir,
                        free >= 0 ? human_bytes(static_cast<uint64_t>(free)) : std::string("an unknown amount"),
                        human_bytes(static_cast<uint64_t>(r.cache_max_bytes)),
                        human_bytes(static_cast<uint64_t>(r.cache_used_bytes)));
  c.figures = {{"requests", r.requests}, {"retries", r.retries}, {"bytes", r.bytes}, {"cache_free_bytes", free},
               {"cache_bytes", r.cache_max_bytes}};
  if (free >= 0 && free + r.cache_used_bytes < r.cache_max_bytes) {
    c.status = Status::kWarn;
    c.fix = fmt::format("the cache's disk cannot hold data.cache_bytes: the run would stop with the disk full. Set "
                        "data.cache_bytes = {} or data.cache_dir on a larger disk",
                        free + r.cache_used_bytes);
  }
  if (r.retries > 0 && c.status == Status::kOk) {
    c.status = Status::kWarn;
    c.fix = "requests were retried already (5xx, timeouts, resets): the store or the network is struggling";
  }
  report.checks.push_back(c);
}

}  // namespace

DoctorReport run_doctor(const JobConfig& job, int local_ranks) {
  DoctorReport report;
  compat::set_num_threads(compute_threads(job, local_ranks));  // as the trainer does, for the timings
  report.checks.push_back(check_cores(job, local_ranks));
  report.checks.push_back(check_memory(local_ranks));
  report.checks.push_back(check_libtorch());
  report.checks.push_back(check_bf16(job));
  report.checks.push_back(check_cuda());
  const auto t0 = Clock::now();
  data::DataSetup ds;
  try {
    ds = data::make_data(job.data, derive_seed(static_cast<uint64_t>(job.run.seed), RngStream::kAugment));
  } catch (const Error& e) {
    report.checks.push_back({"data", Status::kFail, e.what(), "fix the data keys the message names", nullptr});
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
  check_remote(job, *ds.train, report);
  report.checks.push_back(check_io("test", *ds.test, produce_for(*ds.test, 0.5)));
  // The disk: checkpoints of this model and optimizer against the space free under run.dir.
  const data::ImageSpec spec = ds.train->output_spec();
  std::unique_ptr<nn::Model> model = nn::make_model(job.model, spec.channels, spec.height, spec.width, ds.num_classes);
  const std::unique_ptr<Optimizer> optimizer =
      make_optimizer(job.optim, parameter_groups(job.optim, model->named_parameters()));
  int64_t kept = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(std::filesystem::path(job.run.dir) / job.run.name / "checkpoints", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string n = it->path().filename().string();
    kept += n.rfind("ckpt-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
  }
  report.checks.push_back(check_disk(job, checkpoint_bytes(job, *model, *optimizer), kept));
  return report;
}

}  // namespace crucible::commands
