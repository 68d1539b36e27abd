// TensorBoard histograms as a step observer (log.histogram_every = N): every N steps, the
// weights after the update and the gradients the update applied. Rank 0 only (law 4): each
// histogram is a host read, so the other ranks make none.
#include <ATen/ATen.h>

#include "crucible/nn/model.h"
#include "crucible/obs/histogram.h"
#include "crucible/obs/metric_sink.h"
#include "crucible/train/job.h"
#include "crucible/train/recipe.h"

namespace crucible::train {
namespace {

class HistogramObserver final : public StepObserver {
 public:
  explicit HistogramObserver(int64_t every) : every_(every) {}

  bool wants_gradients(int64_t next_step) const override { return next_step % every_ == 0; }

  void gradients(const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) override {
    for (size_t i = 0; i < names.size(); ++i) {
      if (grads[i].defined()) grads_.emplace_back("grad/" + names[i], obs::histogram_of(grads[i]));
    }
  }

  void after_update(const StepEvent& e) override {
    if (e.step % every_ != 0) return;
    obs::NamedHistograms named;  // weights after the update, gradients as the update used them
    for (const auto& p : e.model.named_parameters()) named.emplace_back("weight/" + p.name, obs::histogram_of(p.tensor));
    for (auto& g : grads_) named.push_back(std::move(g));
    grads_.clear();
    e.sinks.histograms(e.step, named);
  }

  std::string describe() const override { return "histograms every " + std::to_string(every_) + " steps"; }

 private:
  int64_t every_;
  obs::NamedHistograms grads_;
};

}  // namespace

std::unique_ptr<StepObserver> make_histogram_observer(const Job& job) {
  if (job.config.log.histogram_every <= 0 || !job.main_rank()) return nullptr;
  return std::make_unique<HistogramObserver>(job.config.log.histogram_every);
}

}  // namespace crucible::train
