// The automatic augmentation policies (see augment.h), following
// torchvision/transforms/v2/_auto_augment.py line by line: the spaces, the policies' tables,
// the order of draws in forward().
#include "crucible/data/transforms/augment.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/data/image/image.h"

namespace crucible::data {
namespace {

using Op = AugmentOp;

// torch.linspace(start, end, steps)[idx] as torch 2.x computes it on the CPU in float32: step =
// (end - start) / (steps - 1); the first half counts up from start, the second down from end,
// each one fused multiply-add (equal to torch 2.14's values for every table of the policies;
// torch 1.13 differs from these in the last bit for some bins).
float linspace_at(double start, double end, int steps, int idx) {
  const float s = static_cast<float>(start), e = static_cast<float>(end);
  if (steps == 1) return s;
  const float step = (e - s) / static_cast<float>(steps - 1);
  if (idx < steps / 2) return std::fma(step, static_cast<float>(idx), s);
  return std::fma(-step, static_cast<float>(steps - idx - 1), e);
}

// (top - (torch.arange(num_bins) / ((num_bins - 1) / div))).round().int()[bin]
int posterize_bits(int top, double div, int num_bins, int bin) {
  const float q = static_cast<float>(bin) / static_cast<float>((num_bins - 1) / div);
  return static_cast<int>(std::nearbyint(static_cast<float>(top) - q));
}

// One AutoAugment sub-policy step: (op, probability, magnitude bin or -1).
struct PolicyStep {
  Op op;
  double p;
  int bin;
};
using SubPolicy = std::array<PolicyStep, 2>;

const std::vector<SubPolicy>& autoaugment_policy(const std::string& name) {
  static const std::vector<SubPolicy> imagenet = {
      {{{Op::kPosterize, 0.4, 8}, {Op::kRotate, 0.6, 9}}},
      {{{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}}},
      {{{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kPosterize, 0.6, 7}, {Op::kPosterize, 0.6, 6}}},
      {{{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}}},
      {{{Op::kEqualize, 0.4, -1}, {Op::kRotate, 0.8, 8}}},
      {{{Op::kSolarize, 0.6, 3}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kPosterize, 0.8, 5}, {Op::kEqualize, 1.0, -1}}},
      {{{Op::kRotate, 0.2, 3}, {Op::kSolarize, 0.6, 8}}},
      {{{Op::kEqualize, 0.6, -1}, {Op::kPosterize, 0.4, 6}}},
      {{{Op::kRotate, 0.8, 8}, {Op::kColor, 0.4, 0}}},
      {{{Op::kRotate, 0.4, 9}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kEqualize, 0.0, -1}, {Op::kEqualize, 0.8, -1}}},
      {{{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}}},
      {{{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}}},
      {{{Op::kRotate, 0.8, 8}, {Op::kColor, 1.0, 2}}},
      {{{Op::kColor, 0.8, 8}, {Op::kSolarize, 0.8, 7}}},
      {{{Op::kSharpness, 0.4, 7}, {Op::kInvert, 0.6, -1}}},
      {{{Op::kShearX, 0.6, 5}, {Op::kEqualize, 1.0, -1}}},
      {{{Op::kColor, 0.4, 0}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}}},
      {{{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}}},
      {{{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}}},
      {{{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}}},
      {{{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}}},
  };
  static const std::vector<SubPolicy> cifar10 = {
      {{{Op::kInvert, 0.1, -1}, {Op::kContrast, 0.2, 6}}},
      {{{Op::kRotate, 0.7, 2}, {Op::kTranslateX, 0.3, 9}}},
      {{{Op::kSharpness, 0.8, 1}, {Op::kSharpness, 0.9, 3}}},
      {{{Op::kShearY, 0.5, 8}, {Op::kTranslateY, 0.7, 9}}},
      {{{Op::kAutoContrast, 0.5, -1}, {Op::kEqualize, 0.9, -1}}},
      {{{Op::kShearY, 0.2, 7}, {Op::kPosterize, 0.3, 7}}},
      {{{Op::kColor, 0.4, 3}, {Op::kBrightness, 0.6, 7}}},
      {{{Op::kSharpness, 0.3, 9}, {Op::kBrightness, 0.7, 9}}},
      {{{Op::kEqualize, 0.6, -1}, {Op::kEqualize, 0.5, -1}}},
      {{{Op::kContrast, 0.6, 7}, {Op::kSharpness, 0.6, 5}}},
      {{{Op::kColor, 0.7, 7}, {Op::kTranslateX, 0.5, 8}}},
      {{{Op::kEqualize, 0.3, -1}, {Op::kAutoContrast, 0.4, -1}}},
      {{{Op::kTranslateY, 0.4, 3}, {Op::kSharpness, 0.2, 6}}},
      {{{Op::kBrightness, 0.9, 6}, {Op::kColor, 0.2, 8}}},
      {{{Op::kSolarize, 0.5, 2}, {Op::kInvert, 0.0, -1}}},
      {{{Op::kEqualize, 0.2, -1}, {Op::kAutoContrast, 0.6, -1}}},
      {{{Op::kEqualize, 0.2, -1}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kColor, 0.9, 9}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kAutoContrast, 0.8, -1}, {Op::kSolarize, 0.2, 8}}},
      {{{Op::kBrightness, 0.1, 3}, {Op::kColor, 0.7, 0}}},
      {{{Op::kSolarize, 0.4, 5}, {Op::kAutoContrast, 0.9, -1}}},
      {{{Op::kTranslateY, 0.9, 9}, {Op::kTranslateY, 0.7, 9}}},
      {{{Op::kAutoContrast, 0.9, -1}, {Op::kSolarize, 0.8, 3}}},
      {{{Op::kEqualize, 0.8, -1}, {Op::kInvert, 0.1, -1}}},
      {{{Op::kTranslateY, 0.7, 9}, {Op::kAutoContrast, 0.9, -1}}},
  };
  static const std::vector<SubPolicy> svhn = {
      {{{Op::kShearX, 0.9, 4}, {Op::kInvert, 0.2, -1}}},
      {{{Op::kShearY, 0.9, 8}, {Op::kInvert, 0.7, -1}}},
      {{{Op::kEqualize, 0.6, -1}, {Op::kSolarize, 0.6, 6}}},
      {{{Op::kInvert, 0.9, -1}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kEqualize, 0.6, -1}, {Op::kRotate, 0.9, 3}}},
      {{{Op::kShearX, 0.9, 4}, {Op::kAutoContrast, 0.8, -1}}},
      {{{Op::kShearY, 0.9, 8}, {Op::kInvert, 0.4, -1}}},
      {{{Op::kShearY, 0.9, 5}, {Op::kSolarize, 0.2, 6}}},
      {{{Op::kInvert, 0.9, -1}, {Op::kAutoContrast, 0.8, -1}}},
      {{{Op::kEqualize, 0.6, -1}, {Op::kRotate, 0.9, 3}}},
      {{{Op::kShearX, 0.9, 4}, {Op::kSolarize, 0.3, 3}}},
      {{{Op::kShearY, 0.8, 8}, {Op::kInvert, 0.7, -1}}},
      {{{Op::kEqualize, 0.9, -1}, {Op::kTranslateY, 0.6, 6}}},
      {{{Op::kInvert, 0.9, -1}, {Op::kEqualize, 0.6, -1}}},
      {{{Op::kContrast, 0.3, 3}, {Op::kRotate, 0.8, 4}}},
      {{{Op::kInvert, 0.8, -1}, {Op::kTranslateY, 0.0, 2}}},
      {{{Op::kShearY, 0.7, 6}, {Op::kSolarize, 0.4, 8}}},
      {{{Op::kInvert, 0.6, -1}, {Op::kRotate, 0.8, 4}}},
      {{{Op::kShearY, 0.3, 7}, {Op::kTranslateX, 0.9, 3}}},
      {{{Op::kShearX, 0.1, 6}, {Op::kInvert, 0.6, -1}}},
      {{{Op::kSolarize, 0.7, 2}, {Op::kTranslateY, 0.6, 7}}},
      {{{Op::kShearY, 0.8, 4}, {Op::kInvert, 0.8, -1}}},
      {{{Op::kShearX, 0.7, 9}, {Op::kTranslateY, 0.8, 3}}},
      {{{Op::kShearY, 0.8, 5}, {Op::kAutoContrast, 0.7, -1}}},
      {{{Op::kShearX, 0.7, 2}, {Op::kInvert, 0.1, -1}}},
  };
  if (name == "imagenet") return imagenet;
  if (name == "cifar10") return cifar10;
  if (name == "svhn") return svhn;
  throw bad_input("data.augment_policy: unknown AutoAugment policy \"{}\" (expected imagenet, cifar10 or svhn)", name);
}

// A transform's magnitude draw: the op's value at `bin`, signed at random where the space says
// (`torch.rand(()) <= 0.5` negates), 0 for ops without magnitudes.
double draw_signed(AugmentSpace space, Op op, int num_bins, int bin, int w, int h, SampleRng& rng) {
  if (!augment_op_has_magnitude(space, op)) return 0.0;
  double m = augment_magnitude(space, op, num_bins, bin, w, h);
  if (augment_op_signed(space, op) && rng.uniform() <= 0.5f) m = -m;
  return m;
}

class TrivialAugmentWide final : public AugmentPolicy {
 public:
  TrivialAugmentWide(int bins, ops::Interpolation i, ops::Fill f) : AugmentPolicy(i, f), bins_(bins) {}
  // One op uniformly; a bin uniformly for ops with magnitudes; then the sign.
  std::vector<PlannedOp> plan(SampleRng& rng, int w, int h) const override {
    constexpr AugmentSpace kSpace = AugmentSpace::kTrivialAugmentWide;
    const auto& space = augment_space_ops(kSpace);
    const Op op = space[static_cast<size_t>(random_index(rng, static_cast<int>(space.size())))];
    if (!augment_op_has_magnitude(kSpace, op)) return {{op, -1, 0.0}};
    const int bin = random_index(rng, bins_);
    return {{op, bin, draw_signed(kSpace, op, bins_, bin, w, h, rng)}};
  }
  std::string describe() const override { return fmt::format("trivialaugment_wide ({} bins, {})", bins_, tail()); }

 private:
  int bins_;
};

class RandAugment final : public AugmentPolicy {
 public:
  RandAugment(int num_ops, int magnitude, int bins, ops::Interpolation i, ops::Fill f)
      : AugmentPolicy(i, f), num_ops_(num_ops), magnitude_(magnitude), bins_(bins) {}
  // num_ops times: one op uniformly (with replacement), at the fixed bin, then the sign.
  std::vector<PlannedOp> plan(SampleRng& rng, int w, int h) const override {
    constexpr AugmentSpace kSpace = AugmentSpace::kRandAugment;
    const auto& space = augment_space_ops(kSpace);
    std::vector<PlannedOp> out;
    for (int k = 0; k < num_ops_; ++k) {
      const Op op = space[static_cast<size_t>(random_index(rng, static_cast<int>(space.size())))];
      const bool has = augment_op_has_magnitude(kSpace, op);
      out.push_back({op, has ? magnitude_ : -1, draw_signed(kSpace, op, bins_, magnitude_, w, h, rng)});
    }
    return out;
  }
  std::string describe() const override {
    return fmt::format("randaugment ({} ops at magnitude {}/{}, {})", num_ops_, magnitude_, bins_, tail());
  }

 private:
  int num_ops_, magnitude_, bins_;
};

class AutoAugment final : public AugmentPolicy {
 public:
  AutoAugment(std::string policy, ops::Interpolation i, ops::Fill f)
      : AugmentPolicy(i, f), name_(std::move(policy)), policies_(&autoaugment_policy(name_)) {}
  // A sub-policy uniformly; each of its two steps with its probability, at its bin of 10, signed.
  std::vector<PlannedOp> plan(SampleRng& rng, int w, int h) const override {
    const SubPolicy& sub = (*policies_)[static_cast<size_t>(random_index(rng, static_cast<int>(policies_->size())))];
    std::vector<PlannedOp> out;
    for (const PolicyStep& s : sub) {
      if (!(rng.uniform() <= static_cast<float>(s.p))) continue;
      out.push_back({s.op, s.bin, draw_signed(AugmentSpace::kAutoAugment, s.op, 10, s.bin, w, h, rng)});
    }
    return out;
  }
  std::string describe() const override { return fmt::format("autoaugment ({} policy, {})", name_, tail()); }

 private:
  std::string name_;
  const std::vector<SubPolicy>* policies_;
};

// AugMix: m ~ Dirichlet(α, α), chain weights ~ Dirichlet(α × width) · m[1]; the result is
// m[0]·image + Σ weight_i · chain_i(image) in float32, truncated to uint8.
class AugMix final : public AugMixTransform {
 public:
  AugMix(const AugmentOptions& o, ops::Interpolation i)
      : interpolation_(i), fill_(o.fill), severity_(o.severity), width_(o.mixture_width), depth_(o.chain_depth),
        alpha_(o.alpha), space_(o.all_ops ? AugmentSpace::kAugMix : AugmentSpace::kAugMixPartial) {}
  AugMixPlan plan(SampleRng& rng, int w, int h) const override {
    AugMixPlan p;
    const double g0 = random_gamma(rng, alpha_), g1 = random_gamma(rng, alpha_);
    p.m0 = static_cast<float>(g0 / (g0 + g1));
    p.m1 = static_cast<float>(g1 / (g0 + g1));
    std::vector<double> gw(static_cast<size_t>(width_));
    double total = 0;
    for (auto& g : gw) total += (g = random_gamma(rng, alpha_));
    for (double g : gw) p.weights.push_back(static_cast<float>(g / total));
    const auto& space = augment_space_ops(space_);
    for (int c = 0; c < width_; ++c) {
      std::vector<PlannedOp>& chain = p.chains.emplace_back();
      const int depth = depth_ > 0 ? depth_ : 1 + random_index(rng, 3);
      for (int d = 0; d < depth; ++d) {
        const Op op = space[static_cast<size_t>(random_index(rng, static_cast<int>(space.size())))];
        if (!augment_op_has_magnitude(space_, op)) {
          chain.push_back({op, -1, 0.0});
          continue;
        }
        const int bin = random_index(rng, severity_);
        chain.push_back({op, bin, draw_signed(space_, op, 10, bin, w, h, rng)});
      }
    }
    return p;
  }
  void apply(ImageRef image, SampleRng& rng) const override {
    const AugMixPlan p = plan(rng, image.width, image.height);
    const size_t n = static_cast<size_t>(image.width) * image.height * image.channels;
    thread_local std::vector<float> mix;
    thread_local std::vector<uint8_t> orig, aug;
    orig.assign(image.pixels, image.pixels + n);
    mix.resize(n);
    for (size_t k = 0; k < n; ++k) mix[k] = static_cast<float>(orig[k]) * p.m0;
    for (size_t c = 0; c < p.chains.size(); ++c) {
      const float weight = p.weights[c] * p.m1;
      aug = orig;
      ImageRef a{aug.data(), image.width, image.height, image.channels, image.planar};
      for (const PlannedOp& op : p.chains[c]) apply_augment_op(a, op.op, op.magnitude, interpolation_, fill_);
      for (size_t k = 0; k < n; ++k) mix[k] += weight * static_cast<float>(aug[k]);
    }
    for (size_t k = 0; k < n; ++k) image.pixels[k] = static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, mix[k])));
  }
  std::string describe() const override {
    return fmt::format("augmix (severity {}, width {}, depth {}, alpha {}, {}{})", severity_, width_,
                       depth_ > 0 ? std::to_string(depth_) : "1-3", alpha_,
                       space_ == AugmentSpace::kAugMix ? "all ops, " : "", ops::interpolation_name(interpolation_));
  }

 private:
  ops::Interpolation interpolation_;
  ops::Fill fill_;
  int severity_, width_, depth_;
  double alpha_;
  AugmentSpace space_;
};

}  // namespace

void AugmentPolicy::apply(ImageRef image, SampleRng& rng) const {
  for (const PlannedOp& p : plan(rng, image.width, image.height)) {
    apply_augment_op(image, p.op, p.magnitude, interpolation_, fill_);
  }
}

std::string AugmentPolicy::tail() const {
  return fmt::format("{}{}", ops::interpolation_name(interpolation_),
                     fill_.set ? fmt::format(", fill {},{},{}", fill_.value[0], fill_.value[1], fill_.value[2]) : "");
}

std::vector<std::array<AutoAugmentStep, 2>> autoaugment_policy_table(const std::string& policy) {
  std::vector<std::array<AutoAugmentStep, 2>> out;
  for (const SubPolicy& sub : autoaugment_policy(policy)) {
    out.push_back({AutoAugmentStep{sub[0].op, sub[0].p, sub[0].bin}, AutoAugmentStep{sub[1].op, sub[1].p, sub[1].bin}});
  }
  return out;
}

const char* augment_op_name(AugmentOp op) {
  switch (op) {
    case Op::kIdentity: return "Identity";
    case Op::kShearX: return "ShearX";
    case Op::kShearY: return "ShearY";
    case Op::kTranslateX: return "TranslateX";
    case Op::kTranslateY: return "TranslateY";
    case Op::kRotate: return "Rotate";
    case Op::kBrightness: return "Brightness";
    case Op::kColor: return "Color";
    case Op::kContrast: return "Contrast";
    case Op::kSharpness: return "Sharpness";
    case Op::kPosterize: return "Posterize";
    case Op::kSolarize: return "Solarize";
    case Op::kAutoContrast: return "AutoContrast";
    case Op::kEqualize: return "Equalize";
    case Op::kInvert: return "Invert";
  }
  return "?";
}

void apply_augment_op(ImageRef image, AugmentOp op, double m, ops::Interpolation interpolation, const ops::Fill& fill) {
  constexpr double kDeg = 180.0 / M_PI;
  switch (op) {
    case Op::kIdentity:
      return;
    case Op::kShearX: {
      const double corner[2] = {0.0, 0.0};
      return ops::affine(image, 0.0, 0.0, 0.0, 1.0, std::atan(m) * kDeg, 0.0, interpolation, fill, corner);
    }
    case Op::kShearY: {
      const double corner[2] = {0.0, 0.0};
      return ops::affine(image, 0.0, 0.0, 0.0, 1.0, 0.0, std::atan(m) * kDeg, interpolation, fill, corner);
    }
    case Op::kTranslateX:
      return ops::affine(image, 0.0, static_cast<double>(static_cast<int64_t>(m)), 0.0, 1.0, 0.0, 0.0, interpolation,
                         fill);
    case Op::kTranslateY:
      return ops::affine(image, 0.0, 0.0, static_cast<double>(static_cast<int64_t>(m)), 1.0, 0.0, 0.0, interpolation,
                         fill);
    case Op::kRotate:
      return ops::rotate(image, m, interpolation, fill);
    case Op::kBrightness:
      return ops::adjust_brightness(image, 1.0 + m);
    case Op::kColor:
      return ops::adjust_saturation(image, 1.0 + m);
    case Op::kContrast:
      return ops::adjust_contrast(image, 1.0 + m);
    case Op::kSharpness:
      return ops::adjust_sharpness(image, 1.0 + m);
    case Op::kPosterize:
      return ops::posterize(image, static_cast<int>(m));
    case Op::kSolarize:
      return ops::solarize(image, 255.0 * m);
    case Op::kAutoContrast:
      return ops::autocontrast(image);
    case Op::kEqualize:
      return ops::equalize(image);
    case Op::kInvert:
      return ops::invert(image);
  }
}

const std::vector<AugmentOp>& augment_space_ops(AugmentSpace space) {
  static const std::vector<Op> wide = {Op::kIdentity,   Op::kShearX,     Op::kShearY,   Op::kTranslateX, Op::kTranslateY,
                                       Op::kRotate,     Op::kBrightness, Op::kColor,    Op::kContrast,   Op::kSharpness,
                                       Op::kPosterize,  Op::kSolarize,   Op::kAutoContrast, Op::kEqualize};
  static const std::vector<Op> autoaugment = {Op::kShearX,     Op::kShearY,    Op::kTranslateX,   Op::kTranslateY,
                                              Op::kRotate,     Op::kBrightness, Op::kColor,       Op::kContrast,
                                              Op::kSharpness,  Op::kPosterize, Op::kSolarize,     Op::kAutoContrast,
                                              Op::kEqualize,   Op::kInvert};
  static const std::vector<Op> augmix_partial = {Op::kShearX,   Op::kShearY,   Op::kTranslateX,
                                                 Op::kTranslateY, Op::kRotate,  Op::kPosterize,
                                                 Op::kSolarize, Op::kAutoContrast, Op::kEqualize};
  static const std::vector<Op> augmix = [] {
    std::vector<Op> v = augmix_partial;
    v.insert(v.end(), {Op::kBrightness, Op::kColor, Op::kContrast, Op::kSharpness});
    return v;
  }();
  switch (space) {
    case AugmentSpace::kTrivialAugmentWide:
    case AugmentSpace::kRandAugment:
      return wide;
    case AugmentSpace::kAutoAugment:
      return autoaugment;
    case AugmentSpace::kAugMix:
      return augmix;
    case AugmentSpace::kAugMixPartial:
      return augmix_partial;
  }
  return wide;
}

bool augment_op_has_magnitude(AugmentSpace, AugmentOp op) {
  return op != Op::kIdentity && op != Op::kAutoContrast && op != Op::kEqualize && op != Op::kInvert;
}

bool augment_op_signed(AugmentSpace, AugmentOp op) {
  return augment_op_has_magnitude(AugmentSpace::kRandAugment, op) && op != Op::kPosterize && op != Op::kSolarize;
}

double augment_magnitude(AugmentSpace space, AugmentOp op, int n, int bin, int w, int h) {
  const bool wide = space == AugmentSpace::kTrivialAugmentWide;
  const bool augmix = space == AugmentSpace::kAugMix || space == AugmentSpace::kAugMixPartial;
  switch (op) {
    case Op::kShearX:
    case Op::kShearY:
      return linspace_at(0.0, wide ? 0.99 : 0.3, n, bin);
    case Op::kTranslateX:
      return linspace_at(0.0, wide ? 32.0 : augmix ? w / 3.0 : 150.0 / 331.0 * w, n, bin);
    case Op::kTranslateY:
      return linspace_at(0.0, wide ? 32.0 : augmix ? h / 3.0 : 150.0 / 331.0 * h, n, bin);
    case Op::kRotate:
      return linspace_at(0.0, wide ? 135.0 : 30.0, n, bin);
    case Op::kBrightness:
    case Op::kColor:
    case Op::kContrast:
    case Op::kSharpness:
      return linspace_at(0.0, wide ? 0.99 : 0.9, n, bin);
    case Op::kPosterize:
      return wide ? posterize_bits(8, 6.0, n, bin) : posterize_bits(augmix ? 4 : 8, 4.0, n, bin);
    case Op::kSolarize:
      return linspace_at(1.0, 0.0, n, bin);
    default:
      return 0.0;
  }
}

int random_index(SampleRng& rng, int n) {
  return static_cast<int>((static_cast<uint64_t>(rng.next_u32()) * static_cast<uint64_t>(n)) >> 32);
}

double random_gamma(SampleRng& rng, double alpha) {
  if (alpha < 1.0) {
    // Gamma(α) = Gamma(α + 1) · U^(1/α)
    const double u = std::max(1e-12, static_cast<double>(rng.uniform()));
    return random_gamma(rng, alpha + 1.0) * std::pow(u, 1.0 / alpha);
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    // A standard normal by Box–Muller from two uniforms in (0, 1].
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    const double x = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

std::shared_ptr<const SampleTransform> make_augment(const AugmentOptions& o) {
  if (o.name == "none" || o.name.empty()) return nullptr;
  const bool augmix = o.name == "augmix";
  const ops::Interpolation interp =
      o.interpolation.empty() ? (augmix ? ops::Interpolation::kBilinear : ops::Interpolation::kNearest)
                              : ops::parse_interpolation(o.interpolation, "data.augment_interpolation");
  for (float v : o.fill.value) {
    if (o.fill.set && !(v >= 0.0f && v <= 255.0f)) {
      throw bad_input("data.augment_fill: values are pixel levels in [0, 255], found {}", v);
    }
  }
  if (o.name == "trivialaugment_wide" || o.name == "randaugment") {
    if (o.num_magnitude_bins < 2) {
      throw bad_input("data.augment_bins: at least 2 magnitude bins are needed, found {}", o.num_magnitude_bins);
    }
  }
  if (o.name == "trivialaugment_wide") return std::make_shared<TrivialAugmentWide>(o.num_magnitude_bins, interp, o.fill);
  if (o.name == "randaugment") {
    if (o.num_ops < 0) throw bad_input("data.augment_num_ops must be >= 0, found {}", o.num_ops);
    if (o.magnitude < 0 || o.magnitude >= o.num_magnitude_bins) {
      throw bad_input("data.augment_magnitude: a bin in [0, {}) (data.augment_bins), found {}", o.num_magnitude_bins,
                      o.magnitude);
    }
    return std::make_shared<RandAugment>(o.num_ops, o.magnitude, o.num_magnitude_bins, interp, o.fill);
  }
  if (o.name == "autoaugment") return std::make_shared<AutoAugment>(o.policy, interp, o.fill);
  if (augmix) {
    if (o.severity < 1 || o.severity > 10) throw bad_input("data.augmix_severity must be in [1, 10], found {}", o.severity);
    if (o.mixture_width < 1) throw bad_input("data.augmix_width must be >= 1, found {}", o.mixture_width);
    if (!(o.alpha > 0.0)) throw bad_input("data.augmix_alpha must be > 0, found {}", o.alpha);
    return std::make_shared<AugMix>(o, interp);
  }
  throw bad_input(
      "data.augment: unknown augmentation \"{}\" (expected none, randaugment, trivialaugment_wide, autoaugment or "
      "augmix)",
      o.name);
}

void declare_settings(ConfigSchema& s, AugmentSettings& o) {
  s.add("data", "augment", &o.name,
        "automatic augmentation after the crop and flip, equal to torchvision's v2 transform of that name")
      .choices({"none", "randaugment", "trivialaugment_wide", "autoaugment", "augmix"});
  s.add("data", "augment_num_ops", &o.num_ops, "randaugment: operations per sample (num_ops)")
      .non_negative()
      .arg("num_ops");
  s.add("data", "augment_magnitude", &o.magnitude, "randaugment: the magnitude bin (magnitude)")
      .non_negative()
      .arg("magnitude");
  s.add("data", "augment_bins", &o.num_magnitude_bins,
        "randaugment, trivialaugment_wide: magnitude bins (num_magnitude_bins)")
      .min(2)
      .arg("num_magnitude_bins");
  s.add("data", "augment_policy", &o.policy, "autoaugment: the learned policy")
      .choices({"imagenet", "cifar10", "svhn"})
      .arg("policy");
  s.add("data", "augment_interpolation", &o.interpolation,
        "geometric operations' interpolation; auto = torchvision's default (bilinear for augmix, nearest otherwise)")
      .choices({"auto", "nearest", "bilinear"})
      .arg("interpolation");
  s.add("data", "augment_fill", &o.fill,
        "pixel levels (0-255) outside shears, translations and rotations: [] = black (fill=None), one value or "
        "one per channel")
      .arg("fill");
  s.add("data", "augmix_severity", &o.severity, "augmix: severity (bins 0..severity-1 of 10)")
      .min(1)
      .max(10)
      .arg("severity");
  s.add("data", "augmix_width", &o.mixture_width, "augmix: augmentation chains (mixture_width)")
      .min(1)
      .arg("mixture_width");
  s.add("data", "augmix_depth", &o.chain_depth, "augmix: operations per chain (-1: 1 to 3 at random)")
      .min(-1)
      .arg("chain_depth");
  s.add("data", "augmix_alpha", &o.alpha, "augmix: Dirichlet and Beta concentration").positive().arg("alpha");
  s.add("data", "augmix_all_ops", &o.all_ops, "augmix: include Brightness, Color, Contrast and Sharpness")
      .arg("all_ops");
}

std::shared_ptr<const SampleTransform> make_augment_piece(const AugmentSettings& a, const ImageSpec& spec) {
  if (a.name == "none") return nullptr;
  if (spec.type == SampleType::kFeatures) {
    throw bad_input("data.augment = \"{}\" needs images; this data set holds float features", a.name);
  }
  AugmentOptions o;
  o.name = a.name;
  o.num_ops = static_cast<int>(a.num_ops);
  o.magnitude = static_cast<int>(a.magnitude);
  o.num_magnitude_bins = static_cast<int>(a.num_magnitude_bins);
  o.policy = a.policy;
  o.interpolation = a.interpolation == "auto" ? "" : a.interpolation;
  if (!a.fill.empty()) {
    if (a.fill.size() != 1 && a.fill.size() != static_cast<size_t>(spec.channels)) {
      throw bad_input("data.augment_fill: one value or one per channel ({}) expected, found {}", spec.channels,
                      a.fill.size());
    }
    o.fill.set = true;
    for (size_t c = 0; c < 3; ++c) {
      o.fill.value[c] = static_cast<float>(a.fill[a.fill.size() == 1 ? 0 : std::min(c, a.fill.size() - 1)]);
    }
  }
  o.severity = static_cast<int>(a.severity);
  o.mixture_width = static_cast<int>(a.mixture_width);
  o.chain_depth = static_cast<int>(a.chain_depth);
  o.alpha = a.alpha;
  o.all_ops = a.all_ops;
  return make_augment(o);
}

}  // namespace crucible::data
