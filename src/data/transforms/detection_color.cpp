// RandomPhotometricDistort for detection (see detection_color.h): v2's make_params and transform
// over the uint8 operations of image_ops.h.
#include "crucible/data/transforms/detection_color.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "crucible/core/error.h"
#include "crucible/data/image/image_ops.h"

namespace crucible::data {
namespace {

// A factor range [lo, hi] inside [min, max]: the adjust_* functions refuse a factor outside it,
// so a bad range is refused when the transform is made, not at some sample of some epoch.
void check_range(const std::array<double, 2>& r, double min, double max, const char* name) {
  if (!(r[0] >= min && r[1] <= max && r[0] <= r[1])) {
    throw bad_input("photometric distort {} = [{}, {}]: expected {} <= min <= max <= {}", name, r[0], r[1], min, max);
  }
}

void check_options(const PhotometricDistortOptions& o) {
  constexpr double kNoMax = 1e300;
  check_range(o.brightness, 0.0, kNoMax, "brightness");
  check_range(o.contrast, 0.0, kNoMax, "contrast");
  check_range(o.saturation, 0.0, kNoMax, "saturation");
  check_range(o.hue, -0.5, 0.5, "hue");
  if (!(o.p >= 0 && o.p <= 1)) throw bad_input("photometric distort p = {}: expected 0 <= p <= 1", o.p);
}

// A uniform index in [0, n) from one 32-bit draw (bias below n / 2^32).
int random_below(SampleRng& rng, int n) {
  return static_cast<int>((static_cast<uint64_t>(rng.next_u32()) * static_cast<uint64_t>(n)) >> 32);
}

// The factor of `key`, or false when the jitter is not applied (absent or empty: v2's None).
bool factor(const DetectionParams& params, const char* key, double* value) {
  const auto it = params.find(key);
  if (it == params.end() || it->second.empty()) return false;
  *value = it->second[0];
  return true;
}

// permute_channels_image: output channel c is input channel perm[c].
void permute_channels(DetectionImage& s, const std::vector<double>& perm) {
  const int c = s.channels;
  if (c != 1 && c != 3) throw bad_input("photometric distort: images with 1 or 3 channels are supported, found {}", c);
  if (perm.size() != static_cast<size_t>(c)) {
    throw bad_input("photometric distort: channel_permutation has {} entries for an image of {} channels", perm.size(),
                    c);
  }
  int from[3] = {0, 1, 2};
  for (int k = 0; k < c; ++k) {
    from[k] = static_cast<int>(perm[k]);
    if (from[k] < 0 || from[k] >= c || perm[k] != from[k]) {
      throw bad_input("photometric distort: channel_permutation[{}] = {} is not a channel of {}", k, perm[k], c);
    }
  }
  if (c == 1 || (from[0] == 0 && from[1] == 1 && from[2] == 2)) return;
  uint8_t* p = s.pixels.data();
  for (size_t i = 0, n = static_cast<size_t>(s.width) * s.height; i < n; ++i, p += c) {
    const uint8_t px[3] = {p[0], p[1], p[2]};
    p[0] = px[from[0]], p[1] = px[from[1]], p[2] = px[from[2]];
  }
}

}  // namespace

namespace detection {

PhotometricDistortOptions photometric_distort_options(const DetectionParams& settings) {
  PhotometricDistortOptions o;
  auto range = [&](const char* key, std::array<double, 2>* r) {
    const auto it = settings.find(key);
    if (it == settings.end()) return;
    if (it->second.size() != 2) {
      throw bad_input("photometric distort {}: expected [min, max], found {} values", key, it->second.size());
    }
    *r = {it->second[0], it->second[1]};
  };
  range("brightness", &o.brightness);
  range("contrast", &o.contrast);
  range("saturation", &o.saturation);
  range("hue", &o.hue);
  if (settings.count("p")) o.p = param(settings, "p", 0, "random_photometric_distort");
  check_options(o);
  return o;
}

DetectionParams draw_photometric_distort(const PhotometricDistortOptions& o, int channels, SampleRng& rng) {
  const auto p = static_cast<float>(o.p);
  DetectionParams params;
  const std::pair<const char*, const std::array<double, 2>*> jitters[] = {{"brightness_factor", &o.brightness},
                                                                          {"contrast_factor", &o.contrast},
                                                                          {"saturation_factor", &o.saturation},
                                                                          {"hue_factor", &o.hue}};
  for (const auto& [key, range] : jitters) {
    // `_generate_value(...) if torch.rand(1) < self.p else None`: the coin first, then the factor.
    auto& value = params[key];
    if (rng.bernoulli(p)) {
      value.push_back(rng.uniform(static_cast<float>((*range)[0]), static_cast<float>((*range)[1])));
    }
  }
  params["contrast_before"] = {rng.bernoulli(0.5f) ? 1.0 : 0.0};
  auto& perm = params["channel_permutation"];
  if (rng.bernoulli(p)) {  // torch.randperm(num_channels): Fisher–Yates, every order equally likely
    std::vector<int> order(static_cast<size_t>(channels));
    std::iota(order.begin(), order.end(), 0);
    for (int i = channels - 1; i > 0; --i) std::swap(order[i], order[random_below(rng, i + 1)]);
    perm.assign(order.begin(), order.end());
  }
  return params;
}

void photometric_distort(DetectionImage& s, const DetectionParams& params) {
  const ImageRef image = s.ref();
  const bool contrast_before = param(params, "contrast_before", 0, "random_photometric_distort") != 0;
  double f = 0;
  if (factor(params, "brightness_factor", &f)) ops::adjust_brightness(image, f);
  const bool contrast = factor(params, "contrast_factor", &f);
  const double contrast_factor = f;
  if (contrast && contrast_before) ops::adjust_contrast(image, contrast_factor);
  if (factor(params, "saturation_factor", &f)) ops::adjust_saturation(image, f);
  if (factor(params, "hue_factor", &f)) ops::adjust_hue(image, f);
  if (contrast && !contrast_before) ops::adjust_contrast(image, contrast_factor);
  const auto it = params.find("channel_permutation");
  if (it != params.end() && !it->second.empty()) permute_channels(s, it->second);
}

}  // namespace detection

RandomPhotometricDistort::RandomPhotometricDistort(PhotometricDistortOptions options) : options_(options) {
  check_options(options_);
}

void RandomPhotometricDistort::apply(DetectionImage& s, SampleRng& rng) const {
  // The registry's op (random_photometric_distort) is these two calls: what the tests compare.
  detection::photometric_distort(s, detection::draw_photometric_distort(options_, s.channels, rng));
}

std::string RandomPhotometricDistort::describe() const {
  const auto& o = options_;
  return fmt::format(
      "photometric distort p={} (brightness [{}, {}], contrast [{}, {}], saturation [{}, {}], hue [{}, {}])", o.p,
      o.brightness[0], o.brightness[1], o.contrast[0], o.contrast[1], o.saturation[0], o.saturation[1], o.hue[0],
      o.hue[1]);
}

}  // namespace crucible::data
