// torchvision's automatic augmentation policies as sample transforms (data.augment): RandAugment,
// TrivialAugmentWide, AutoAugment (imagenet, cifar10, svhn policies) and AugMix, with
// torchvision.transforms.v2's operation spaces, magnitude bins and rules of choice, on the
// loader threads after the crop and flip (torchvision's preset order). Each draw comes from the
// sample's own stream (law 1): an op, a bin, a sign, a probability — so a sample's pixels never
// depend on the thread count or on a resume. The operations are image_ops.h. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/image/image_ops.h"
#include "crucible/data/transforms/sample_transform.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

// The operations of torchvision's _AutoAugmentBase._apply_image_or_video_transform.
enum class AugmentOp {
  kIdentity, kShearX, kShearY, kTranslateX, kTranslateY, kRotate, kBrightness, kColor, kContrast, kSharpness,
  kPosterize, kSolarize, kAutoContrast, kEqualize, kInvert
};
const char* augment_op_name(AugmentOp op);  // torchvision's name: "ShearX", "AutoContrast", …

// torchvision's transform of `op` at `magnitude` (already signed): ShearX at m is affine with
// shear atan(m) degrees about the top-left corner, Translate moves int(m) pixels, Brightness,
// Color, Contrast and Sharpness use factor 1 + m, Posterize keeps int(m) bits, Solarize's
// threshold is 255·m.
void apply_augment_op(ImageRef image, AugmentOp op, double magnitude, ops::Interpolation interpolation,
                      const ops::Fill& fill);

// The operation spaces (each transform's _AUGMENTATION_SPACE).
enum class AugmentSpace { kTrivialAugmentWide, kRandAugment, kAutoAugment, kAugMix, kAugMixPartial };
// The space's operations in torchvision's dictionary order (what a uniform choice picks from).
const std::vector<AugmentOp>& augment_space_ops(AugmentSpace space);
// Whether `op`'s magnitude takes a random sign in `space`; whether it has magnitudes at all.
bool augment_op_signed(AugmentSpace space, AugmentOp op);
bool augment_op_has_magnitude(AugmentSpace space, AugmentOp op);
// magnitudes_fn(num_bins, height, width)[bin], as float32 then widened (torch.linspace's scalar
// formula; Posterize's bins are rounded float32).
double augment_magnitude(AugmentSpace space, AugmentOp op, int num_bins, int bin, int width, int height);

struct AugmentOptions {
  std::string name = "none";  // "none" | "randaugment" | "trivialaugment_wide" | "autoaugment" | "augmix"
  int num_ops = 2;             // randaugment
  int magnitude = 9;           // randaugment: the bin every op uses
  int num_magnitude_bins = 31; // randaugment, trivialaugment_wide
  std::string policy = "imagenet";  // autoaugment: imagenet | cifar10 | svhn
  int severity = 3;            // augmix: bins 0..severity-1 of 10
  int mixture_width = 3;       // augmix: chains
  int chain_depth = -1;        // augmix: ops per chain (-1: 1 to 3 at random)
  double alpha = 1.0;          // augmix: Dirichlet and Beta concentration
  bool all_ops = true;         // augmix: with Brightness, Color, Contrast, Sharpness
  // "" is the transform's torchvision default: bilinear for augmix, nearest for the others.
  std::string interpolation;
  ops::Fill fill;
};

// One operation a policy chose for one sample: the op, its magnitude bin (-1: none) and its
// signed magnitude.
struct PlannedOp {
  AugmentOp op;
  int bin;
  double magnitude;
};

// RandAugment, TrivialAugmentWide and AutoAugment: a policy first draws its plan from the
// sample's stream (in torchvision's order of draws), then applies it. AugMix mixes chains and is
// not one of these.
class AugmentPolicy : public SampleTransform {
 public:
  AugmentPolicy(ops::Interpolation interpolation, ops::Fill fill) : interpolation_(interpolation), fill_(fill) {}
  virtual std::vector<PlannedOp> plan(SampleRng& rng, int width, int height) const = 0;
  void apply(ImageRef image, SampleRng& rng) const override;

 protected:
  std::string tail() const;  // "nearest" or "bilinear, fill 128,128,128": the describe() suffix
  ops::Interpolation interpolation_;
  ops::Fill fill_;
};

// AugMix's draws for one sample, in torchvision's order: m ~ Dirichlet(α, α), the chain weights
// ~ Dirichlet(α × width) (both float32, as torch samples them; the weights before m[1] scales
// them), then each chain's operations (1 to 3 of them at random unless chain_depth > 0), each
// with its bin of 0 … severity-1 and its signed magnitude.
struct AugMixPlan {
  float m0 = 0, m1 = 0;
  std::vector<float> weights;
  std::vector<std::vector<PlannedOp>> chains;
};

// AugMix: m0·image + Σ_c weights[c]·m1·chain_c(image), in float32, truncated to uint8.
class AugMixTransform : public SampleTransform {
 public:
  virtual AugMixPlan plan(SampleRng& rng, int width, int height) const = 0;
};

// The sub-policies of AutoAugment's `policy` (imagenet, cifar10, svhn) in torchvision's order:
// each step's op, probability and magnitude bin of 10 (-1: an op without magnitudes).
struct AutoAugmentStep {
  AugmentOp op;
  double p;
  int bin;
};
std::vector<std::array<AutoAugmentStep, 2>> autoaugment_policy_table(const std::string& policy);

// The transform data.augment names, or nullptr for "none". bad_input names the key of a bad option.
std::shared_ptr<const SampleTransform> make_augment(const AugmentOptions& options);

// data.augment and its options as a job's config holds them (the recipe's "augment" piece, after
// the flip): each key carries torchvision's keyword (ConfigKey::arg), which the Python loaders
// accept in augment_options.
struct AugmentSettings {
  std::string name = "none";          // data.augment
  int64_t num_ops = 2;                // data.augment_num_ops
  int64_t magnitude = 9;              // data.augment_magnitude
  int64_t num_magnitude_bins = 31;    // data.augment_bins
  std::string policy = "imagenet";    // data.augment_policy
  std::string interpolation = "auto"; // data.augment_interpolation: auto = the transform's default
  std::vector<double> fill;           // data.augment_fill: [] (fill=None), one value or one per channel
  int64_t severity = 3;               // data.augmix_severity
  int64_t mixture_width = 3;          // data.augmix_width
  int64_t chain_depth = -1;           // data.augmix_depth
  double alpha = 1.0;                 // data.augmix_alpha
  bool all_ops = true;                // data.augmix_all_ops
};
void declare_settings(ConfigSchema& schema, AugmentSettings& settings);
// The transform for a training pipeline of `spec`, or null for "none" (bad_input for float
// features, or a fill of neither one value nor one per channel).
std::shared_ptr<const SampleTransform> make_augment_piece(const AugmentSettings& settings, const ImageSpec& spec);

// Draws for torchvision's _get_random_item / torch.randint(n, ()): uniform in [0, n).
int random_index(SampleRng& rng, int n);
// A Gamma(alpha, 1) draw (Marsaglia–Tsang) from the sample's stream: AugMix's Dirichlet weights.
double random_gamma(SampleRng& rng, double alpha);

}  // namespace crucible::data
