// torchvision's functional image operations on uint8 images, in place, computed as
// torchvision.transforms.v2.functional computes them on a uint8 tensor (float32 arithmetic in
// the same order, fused multiply-adds where torch's CPU kernels fuse, truncation where it casts),
// so the point operations give torchvision's bytes and the geometric ones its coordinates. The
// augmentation policies (augment.h) are built from these. Images have 1 or 3 channels,
// interleaved or planar (ImageRef). Torch-free, thread-safe (scratch space is thread-local).
//
// Hand-written: no Debian package offers torchvision's arithmetic outside torch.
#pragma once

#include <array>
#include <cstdint>

#include "crucible/data/transforms/sample_transform.h"

namespace crucible::data::ops {

enum class Interpolation { kNearest, kBilinear };
const char* interpolation_name(Interpolation mode);
// "nearest" | "bilinear"; bad_input naming `key` otherwise.
Interpolation parse_interpolation(const std::string& name, const char* key);

// The colour outside a geometric transform: torchvision's fill (None: zeros through grid_sample's
// zero padding; a value per channel otherwise, blended with the sampled mask).
struct Fill {
  bool set = false;
  std::array<float, 3> value{0, 0, 0};
};

// adjust_brightness(image, factor): image × factor.
void adjust_brightness(ImageRef image, double factor);
// adjust_saturation(image, factor): blend with floor(grayscale) (no-op on one channel).
void adjust_saturation(ImageRef image, double factor);
// adjust_contrast(image, factor): blend with the mean of floor(grayscale).
void adjust_contrast(ImageRef image, double factor);
// adjust_hue(image, hue_factor): rgb → hsv in float32 (levels × 1/255), hue + factor modulo 1,
// hsv → rgb, × 255.999 truncated; -0.5 <= hue_factor <= 0.5 (no-op on one channel).
void adjust_hue(ImageRef image, double hue_factor);
// adjust_sharpness(image, factor): blend with the rounded 3×3 (1,1,1;1,5,1;1,1,1)/13 blur inside
// a one-pixel border, which stays as it is.
void adjust_sharpness(ImageRef image, double factor);
// posterize(image, bits): keep the top `bits` bits (0..8).
void posterize(ImageRef image, int bits);
// solarize(image, threshold): invert values >= threshold.
void solarize(ImageRef image, double threshold);
// autocontrast(image): stretch each channel's [min, max] to [0, 255].
void autocontrast(ImageRef image);
// equalize(image): PIL's histogram equalisation per channel (torchvision's formulation).
void equalize(ImageRef image);
// invert(image): 255 - value.
void invert(ImageRef image);

// affine(image, angle, translate, scale, shear, interpolation, fill, center): the output keeps the
// input's size. Angles in degrees; `center` in pixels (nullptr: the image's centre).
void affine(ImageRef image, double angle, double translate_x, double translate_y, double scale, double shear_x,
            double shear_y, Interpolation interpolation, const Fill& fill, const double* center = nullptr);
// rotate(image, angle, interpolation, fill), expand=False, about the centre; 0, 180 and (square
// images) 90 and 270 degrees are exact index permutations, as in torchvision.
void rotate(ImageRef image, double angle, Interpolation interpolation, const Fill& fill);

namespace testing {
// Whether affine/rotate may take the AVX2 path where the CPU has it (default true); false forces
// the scalar code, so a test can check that both give the same bytes. Not thread-safe.
void set_vector_warp(bool allowed);
}  // namespace testing

}  // namespace crucible::data::ops
