// tune_batch: doubling, then bisection, over one real training step (TrialStep) per try.
#include "crucible/commands/tune.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>

#include "crucible/core/memory.h"
#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/rng.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/nn/model.h"
#include "crucible/data/data_setup.h"
#include "crucible/train/step.h"

namespace crucible::commands {

using namespace crucible::train;
namespace {

bool out_of_memory(const std::exception& e) {
  const std::string w = e.what();
  return dynamic_cast<const std::bad_alloc*>(&e) != nullptr || w.find("out of memory") != std::string::npos ||
         w.find("can't allocate memory") != std::string::npos;
}

}  // namespace

TuneResult tune_batch(const JobConfig& job, int64_t budget_bytes, int64_t max_batch) {
  const c10::Device device(c10::kCPU);
  data::DataSetup ds = data::make_data(job.data, derive_seed(static_cast<uint64_t>(job.run.seed), RngStream::kAugment));
  const data::ImageSpec spec = ds.train->output_spec();
  const data::NormalizeOptions norm = normalize_options(job);
  // The step that trains (TrialStep), in the job's precision (auto: what it picks on a CPU).
  const Precision precision = job.train.precision == PrecisionMode::kAuto
                                  ? cpu_auto_precision(cpu_has_native_bf16(), job.train.channels_last)
                                  : configured_precision(job.train.precision, job.train.channels_last);
  data::DeviceInput input(spec, norm, device, precision.channels_last);

  TuneResult result;
  auto attempt = [&](int64_t b) {
    TuneTry t;
    t.batch = b;
    const data::Batch batch = data::sample_batch(*ds.train, b);
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::unique_ptr<compat::CpuMemoryBudget> budget;
      if (budget_bytes > 0) budget = std::make_unique<compat::CpuMemoryBudget>(budget_bytes);
      try {
        TrialStep trial(job, spec.channels, spec.height, spec.width, ds.num_classes, precision, device);
        trial.run(input.images(batch), input.labels(batch));
        t.fits = true;
      } catch (const std::exception& e) {
        if (!out_of_memory(e)) throw;
      }
      if (budget) t.peak_bytes = budget->peak_bytes();
    }
    compat::release_cached_memory(device);
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_info("batch {:>6}: {}{}", b, t.fits ? "fits" : "out of memory",
             budget_bytes > 0 && t.fits ? fmt::format(" (peak {:.1f} MiB of {:.1f})", t.peak_bytes / 1048576.0,
                                                      budget_bytes / 1048576.0)
                                        : "");
    result.tries.push_back(t);
    return t;
  };

  int64_t lo = 0, hi = 0;
  for (int64_t b = 1;; b *= 2) {
    const int64_t cand = std::min(b, max_batch);
    const TuneTry t = attempt(cand);
    if (!t.fits) {
      hi = cand;
      break;
    }
    lo = cand;
    result.peak_bytes = t.peak_bytes;
    if (cand == max_batch) break;
  }
  if (lo == 0) {
    throw bad_input("not even a batch of 1 fits in {:.1f} MiB (raise --budget-mb or use a smaller model)",
                    budget_bytes / 1048576.0);
  }
  while (hi > 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const TuneTry t = attempt(mid);
    if (t.fits) {
      lo = mid;
      result.peak_bytes = t.peak_bytes;
    } else {
      hi = mid;
    }
  }
  result.batch = lo;
  return result;
}

}  // namespace crucible::commands
