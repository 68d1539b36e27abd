// The [loss] section: each loss's own keys (one entry per loss; the loss itself is in loss.cpp,
// under the same name).
#include "crucible/train/loss_options.h"

#include "crucible/core/config.h"

namespace crucible::train {
namespace {

// Label smoothing and class weights, which both losses take.
void declare_smoothing_weights(LossSection& o, ConfigSchema& s) {
  if (s.find("loss", "label_smoothing") != nullptr) return;
  s.add("loss", "label_smoothing", &o.label_smoothing, "cross_entropy: label smoothing").min(0).max(1, true);
  s.add("loss", "class_weights", &o.class_weights, "cross_entropy: one weight per class, in label order ([] = all equal)")
      .non_negative();
}

}  // namespace

const Registry<LossSettings>& loss_settings_registry() {
  static const Registry<LossSettings> registry = [] {
    Registry<LossSettings> r("loss");
    r.add("cross_entropy", "softmax cross-entropy over class indices (label smoothing, class weights)",
          {declare_smoothing_weights});
    r.add("binary_cross_entropy", "a sigmoid per class (multi-label targets, or one-hot of class indices)",
          {declare_smoothing_weights});
    return r;
  }();
  return registry;
}

void declare_loss_settings(LossSection& o, ConfigSchema& s) {
  s.add("loss", "name", &o.name, "training loss").choices(loss_settings_registry().names());
  for (const auto& e : loss_settings_registry().entries()) e.factory.declare(o, s);
}

}  // namespace crucible::train
