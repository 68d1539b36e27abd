// Per-sample transforms on uint8 pixels, before collation: RandomResizedCrop with
// torchvision's semantics, the evaluation resize + centre crop, an antialiased resize, and the
// horizontal flip. Crop parameters are drawn from the sample's own RNG stream (law 1).
// Torch-free; all functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "crucible/core/rng.h"
#include "crucible/data/image/decode.h"

namespace crucible::data {

struct RandomResizedCropOptions {
  double scale_min = 0.08, scale_max = 1.0;          // fraction of the image area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
};

// torchvision.transforms.RandomResizedCrop.get_params: ten tries at a random area and log-
// uniform aspect ratio that fits, then a centre crop clamped to the ratio range.
Rect random_resized_crop(int width, int height, SampleRng& rng, const RandomResizedCropOptions& options = {});

// The central square of round(short side × crop_fraction) source pixels: close to, but not
// exactly, what torchvision's evaluation transform keeps (the pipeline uses resize_centre_crop).
Rect center_crop_region(int width, int height, double crop_fraction = 0.875);

// torchvision's evaluation transform, Resize(int(crop / fraction)) + CenterCrop(crop), on a
// width × height image: the whole image is resized to resized_width × resized_height (the short
// side to int(crop / fraction), the long side to int(that × long / short), as
// transforms.Resize computes it) and crop × crop pixels are taken at (left, top) of the result
// (Python's round, half to even, of half the margin, as transforms.CenterCrop). For the
// ImageNet recipe (crop 224, fraction 0.875): Resize(256) + CenterCrop(224). fraction in (0, 1].
struct ResizeCentreCrop {
  int resized_width = 0, resized_height = 0;
  int left = 0, top = 0;
};
ResizeCentreCrop resize_centre_crop(int width, int height, int crop, double fraction = 0.875);
// The same with the short side given: Resize(size) + CenterCrop(crop), size >= crop (FixRes:
// torchvision's ResNet-50 recipe evaluates Resize(232) + CenterCrop(224)).
ResizeCentreCrop resize_centre_crop_to(int width, int height, int size, int crop);

// Resizes the [src_h, src_w, channels] uint8 image region (`src_stride` bytes per row) to
// [dst_h, dst_w, channels], with PIL's antialiased bilinear filter (a triangle widened by the
// downscale factor), byte for byte as torch resizes uint8 images (antialias=True: torchvision's v2
// Resize on tensors): the horizontal pass first, then the vertical, each in torch's fixed point
// and rounded to bytes; `flip` mirrors the output horizontally on the way
// (the same bytes as resize then hflip_image, without the extra pass). `planar`: dst is
// [channels, dst_h, dst_w] instead (the same bytes, transposed: a loader's NCHW batch).
void resize_image(const uint8_t* src, int src_w, int src_h, int src_stride, int channels, uint8_t* dst, int dst_w,
                  int dst_h, bool flip = false, bool planar = false);

// Test seam: whether resize_image uses its AVX2 kernels (where the CPU has AVX2) or the portable
// ones, which give the same bytes. Returns the previous setting.
bool use_resize_avx2_for_testing(bool enable);

// Mirrors each row of a [h, w, channels] image in place.
void hflip_image(uint8_t* pixels, int w, int h, int channels);

}  // namespace crucible::data
