// `crucible bench model` (see model_bench.h).
#include "crucible/commands/model_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/nn/model.h"
#include "crucible/data/data_setup.h"
#include "crucible/train/step.h"

namespace crucible::commands {

using namespace crucible::train;
namespace {

using Clock = std::chrono::steady_clock;

// Tensor bytes at their peak during one measurement, on any device.
class PeakMemory {
 public:
  explicit PeakMemory(c10::Device device) : device_(device) {
    if (device.is_cuda()) {
      compat::reset_device_peak(device);
    } else {
      cpu_ = std::make_unique<compat::CpuMemoryBudget>(std::numeric_limits<int64_t>::max() / 2);
    }
  }
  int64_t bytes() const { return cpu_ ? cpu_->peak_bytes() : compat::device_peak_bytes(device_); }

 private:
  c10::Device device_;
  std::unique_ptr<compat::CpuMemoryBudget> cpu_;
};

// Runs `once` options.warmup times, then counts runs until options.repeats or options.seconds
// (at least 3), each between device synchronisations.
template <typename F>
ModelBenchRow measure(const ModelBenchOptions& o, c10::Device device, int64_t batch, F&& once) {
  for (int i = 0; i < o.warmup; ++i) once();
  compat::synchronize(device);
  std::vector<double> ms;
  const auto start = Clock::now();
  while (static_cast<int>(ms.size()) < o.repeats &&
         (ms.size() < 3 || std::chrono::duration<double>(Clock::now() - start).count() < o.seconds)) {
    compat::synchronize(device);
    const auto t0 = Clock::now();
    once();
    compat::synchronize(device);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  ModelBenchRow r;
  r.runs = static_cast<int>(ms.size());
  r.median_ms = percentile(ms, 50);
  r.p90_ms = percentile(ms, 90);
  r.min_ms = *std::min_element(ms.begin(), ms.end());
  r.samples_per_s = r.median_ms > 0 ? 1000.0 * static_cast<double>(batch) / r.median_ms : 0;
  return r;
}

}  // namespace

double percentile(std::vector<double> ms, double p) {
  std::sort(ms.begin(), ms.end());
  const double pos = p / 100.0 * static_cast<double>(ms.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, ms.size() - 1);
  return ms[lo] + (pos - static_cast<double>(lo)) * (ms[hi] - ms[lo]);
}

ModelBenchResult bench_model(const JobConfig& job, const ModelBenchOptions& o) {
  if (o.warmup < 0 || o.repeats < 3 || o.seconds <= 0) {
    throw bad_input("bench model: --warmup must be ≥ 0, --repeats ≥ 3 and --seconds > 0 (found {}, {}, {})", o.warmup,
                    o.repeats, o.seconds);
  }
  const c10::Device device = compat::resolve_device(job.train.device);
  compat::set_num_threads(compute_threads(job, 1));
  data::DataSetup ds = data::make_data(job.data, derive_seed(static_cast<uint64_t>(job.run.seed), RngStream::kAugment));
  const data::ImageSpec spec = ds.train->output_spec();
  const int64_t batch = o.batch > 0 ? o.batch : job.train.batch_size;
  const data::Batch b = data::sample_batch(*ds.train, batch);

  std::vector<Precision> candidates;
  if (o.all_precisions) {
    candidates = {{ComputeDtype::kFp32, false}, {ComputeDtype::kFp32, true}};
    if (compat::autocast_supported(device.type(), c10::ScalarType::BFloat16)) {
      candidates.push_back({ComputeDtype::kBf16, false});
      candidates.push_back({ComputeDtype::kBf16, true});
    }
  } else {
    candidates = {job.train.precision == PrecisionMode::kAuto
                      ? cpu_auto_precision(device.is_cuda() || cpu_has_native_bf16(), job.train.channels_last)
                      : configured_precision(job.train.precision, job.train.channels_last)};
  }

  ModelBenchResult result;
  result.device = device.str();
  result.batch = batch;
  result.warmup = o.warmup;
  result.input = fmt::format("{} × {}", batch, spec.to_string());
  const data::NormalizeOptions norm = normalize_options(job);
  for (const Precision& p : candidates) {
    data::DeviceInput in(spec, norm, device, p.channels_last);
    const at::Tensor x = in.images(b), y = in.labels(b);
    {                           // Inference: eval mode, no autograd, the job's autocast.
      PeakMemory peak(device);  // the weights count, as in the training step's
      compat::seed_cpu_generator(derive_seed(static_cast<uint64_t>(job.run.seed), RngStream::kInit));
      std::unique_ptr<nn::Model> model =
          nn::make_model(job.model, spec.channels, spec.height, spec.width, ds.num_classes);
      model->to(device);
      if (p.channels_last) nn::to_channels_last(*model);
      model->train(false);
      if (result.model.empty()) result.model = model->describe();
      at::NoGradGuard no_grad;
      ModelBenchRow r = measure(o, device, batch, [&] {
        compat::AutocastGuard amp(device.type(), autocast_dtype(p), p.mixed());
        (void)model->forward(x);
      });
      r.peak_bytes = peak.bytes();
      r.precision = p;
      r.what = "forward";
      result.rows.push_back(r);
    }
    {  // The training step that trains (TrialStep ends in the step's own host read).
      PeakMemory peak(device);
      TrialStep trial(job, spec.channels, spec.height, spec.width, ds.num_classes, p, device);
      ModelBenchRow r = measure(o, device, batch, [&] { trial.run(x, y); });
      r.peak_bytes = peak.bytes();
      r.precision = p;
      r.what = "train_step";
      result.rows.push_back(r);
    }
    log_info("bench model: {} done ({} forward, {} training steps timed)", p.to_string(), result.rows.end()[-2].runs,
             result.rows.back().runs);
  }
  return result;
}

std::string ModelBenchResult::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const auto& r : rows) {
    rows_json.push_back({{"precision", r.precision.dtype_name()},
                         {"memory_format", r.precision.memory_format_name()},
                         {"what", r.what},
                         {"runs", r.runs},
                         {"median_ms", r.median_ms},
                         {"p90_ms", r.p90_ms},
                         {"min_ms", r.min_ms},
                         {"samples_per_s", r.samples_per_s},
                         {"peak_bytes", r.peak_bytes}});
  }
  return nlohmann::json{{"model", model}, {"device", device}, {"input", input},
                        {"batch", batch}, {"warmup", warmup}, {"rows", rows_json}}
      .dump();
}

std::string ModelBenchResult::to_text() const {
  std::string out = fmt::format("{} on {}, input {}, {} warm-up run(s) excluded\n", model, device, input, warmup);
  out += fmt::format("{:<24} {:<11} {:>5} {:>11} {:>11} {:>12} {:>11}\n", "precision", "what", "runs", "median ms",
                     "p90 ms", "samples/s", "peak MiB");
  for (const auto& r : rows) {
    out += fmt::format("{:<24} {:<11} {:>5} {:>11.2f} {:>11.2f} {:>12.0f} {:>11.1f}\n", r.precision.to_string(), r.what,
                       r.runs, r.median_ms, r.p90_ms, r.samples_per_s, static_cast<double>(r.peak_bytes) / 1048576.0);
  }
  return out;
}

}  // namespace crucible::commands
