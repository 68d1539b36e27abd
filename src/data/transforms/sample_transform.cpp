// SampleTransform chain helpers and RandomHorizontalFlip (see sample_transform.h).
#include "crucible/data/transforms/sample_transform.h"

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/image/image.h"
#include "crucible/data/transforms/transform.h"

namespace crucible::data {

void apply_transforms(const SampleTransforms& transforms, size_t first, ImageRef image, SampleRng& rng) {
  for (size_t i = first; i < transforms.size(); ++i) transforms[i]->apply(image, rng);
}

std::string describe_transforms(const SampleTransforms& transforms) {
  std::string out;
  for (const auto& t : transforms) out += (out.empty() ? "" : ", ") + t->describe();
  return out;
}

RandomHorizontalFlip::RandomHorizontalFlip(float p) : p_(p) {
  if (!(p >= 0.0f && p <= 1.0f)) throw bad_input("horizontal flip: probability must be in [0, 1], found {}", p);
}

void RandomHorizontalFlip::apply(ImageRef image, SampleRng& rng) const {
  if (!rng.bernoulli(p_)) return;
  if (image.planar) {
    // Each plane's rows are rows of one-byte pixels: mirror channels × height rows.
    hflip_image(image.pixels, image.width, image.height * image.channels, 1);
  } else {
    hflip_image(image.pixels, image.width, image.height, image.channels);
  }
}

bool RandomHorizontalFlip::fold_mirror(SampleRng& rng, bool* mirror) const {
  *mirror = rng.bernoulli(p_);
  return true;
}

std::string RandomHorizontalFlip::describe() const { return fmt::format("flip p={}", p_); }

void declare_settings(ConfigSchema& s, RandomHorizontalFlipOptions& o) {
  s.add("data", "hflip", &o.p, "probability of a random horizontal flip").min(0).max(1);
}

std::shared_ptr<const SampleTransform> make_random_horizontal_flip(const RandomHorizontalFlipOptions& o,
                                                                   const ImageSpec& spec) {
  if (o.p <= 0) return nullptr;
  if (spec.type == SampleType::kFeatures) {
    log_info("data: data.hflip = {} does not apply to float features (used as they are)", o.p);
    return nullptr;
  }
  return std::make_shared<RandomHorizontalFlip>(static_cast<float>(o.p));
}

}  // namespace crucible::data
