// The schedule registry (one line per schedule; each in its own file under schedules/), the
// Schedule that holds the chosen one's curve, and multi-scale's size draw.
#include "crucible/train/schedule.h"

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/rng.h"

namespace crucible::train {

// Each entry, defined in its own file.
ScheduleKind one_cycle_schedule();          // schedules/one_cycle.cpp
ScheduleKind warmup_cosine_schedule();      // schedules/one_cycle.cpp
ScheduleKind constant_schedule();           // schedules/one_cycle.cpp
ScheduleKind torchvision_chain_schedule();  // schedules/torchvision_chain.cpp
ScheduleKind multistep_schedule();          // schedules/multistep.cpp

const Registry<ScheduleKind>& schedule_registry() {
  static const Registry<ScheduleKind> registry = [] {
    Registry<ScheduleKind> r("schedule");
    r.add("onecycle", "PyTorch's OneCycleLR: cosine rise to the peak lr and fall, momentum cycled inversely",
          one_cycle_schedule());
    r.add("warmup_cosine", "linear warm-up to the peak lr, then a cosine down", warmup_cosine_schedule());
    r.add("constant", "the peak lr throughout", constant_schedule());
    r.add("step", "torchvision's reference: StepLR after an optional warm-up", torchvision_chain_schedule());
    r.add("cosine", "torchvision's reference: CosineAnnealingLR after an optional warm-up",
          torchvision_chain_schedule());
    r.add("exponential", "torchvision's reference: ExponentialLR after an optional warm-up",
          torchvision_chain_schedule());
    r.add("multistep", "torchvision's detection reference: MultiStepLR after a linear warm-up in the first epoch",
          multistep_schedule());
    return r;
  }();
  return registry;
}

void declare_schedule_settings(ScheduleOptions& options, ConfigSchema& schema) {
  schema
      .add("schedule", "name", &options.name,
           "learning-rate schedule; step, cosine and exponential are torchvision's reference (StepLR, "
           "CosineAnnealingLR, ExponentialLR after an optional warm-up), equal to torch's at every step")
      .choices(schedule_registry().names());
  for (const auto& e : schedule_registry().entries()) e.factory.declare(options, schema);
}

Schedule::Schedule(const ScheduleOptions& options, double peak_lr, double momentum, int64_t total_steps,
                   int64_t steps_per_epoch)
    : total_(total_steps) {
  if (total_ < 1) throw bad_input("schedule: training has {} steps; at least 1 is needed", total_);
  curve_ = schedule_registry().get(options.name, "schedule.name").factory.make(
      {options, peak_lr, momentum, total_steps, steps_per_epoch});
}

int64_t multi_scale_size(uint64_t seed, int64_t step, const std::vector<int64_t>& sizes) {
  SampleRng rng(derive_seed(seed, RngStream::kScale), static_cast<uint64_t>(step), 0);
  return sizes[rng.next_u32() % static_cast<uint32_t>(sizes.size())];
}

}  // namespace crucible::train
