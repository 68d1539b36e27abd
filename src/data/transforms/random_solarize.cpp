// RandomSolarize (see random_solarize.h).
#include "crucible/data/transforms/random_solarize.h"

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/data/image/image_ops.h"
#include "crucible/data/image/image.h"

namespace crucible::data {

void declare_settings(ConfigSchema& s, RandomSolarizeOptions& o) {
  s.add("data", "solarize", &o.p,
        "probability of torchvision's RandomSolarize per training sample, after the automatic augmentation (0 = off)")
      .min(0)
      .max(1);
  s.add("data", "solarize_threshold", &o.threshold,
        "RandomSolarize's threshold in pixel levels: values >= it become 255 - value")
      .min(0)
      .max(255);
}

RandomSolarize::RandomSolarize(const RandomSolarizeOptions& options) : o_(options) {
  if (!(o_.p >= 0 && o_.p <= 1)) throw bad_input("data.solarize: expected a probability in [0, 1], found {}", o_.p);
  if (!(o_.threshold >= 0 && o_.threshold <= 255)) {
    throw bad_input("data.solarize_threshold: expected a pixel level in [0, 255], found {}", o_.threshold);
  }
}

void RandomSolarize::apply(ImageRef image, SampleRng& rng) const {
  if (!rng.bernoulli(static_cast<float>(o_.p))) return;  // v2: `if torch.rand(1) >= self.p: return`
  ops::solarize(image, o_.threshold);
}

std::string RandomSolarize::describe() const { return fmt::format("solarize p={} threshold={}", o_.p, o_.threshold); }

std::shared_ptr<const SampleTransform> make_random_solarize(const RandomSolarizeOptions& options, const ImageSpec& spec) {
  if (options.p <= 0) return nullptr;
  if (spec.type == SampleType::kFeatures) {
    throw bad_input("data.solarize = {} needs images; this data set holds float features", options.p);
  }
  return std::make_shared<RandomSolarize>(options);
}

}  // namespace crucible::data
