// YOLOX's training pipeline (the `yolox` package 0.3.0, yolox/data/data_augment.py and
// datasets/mosaicdetection.py, with the defaults of exp/yolox_base.py): Mosaic on a doubled
// canvas, random_affine (rotation, scale, shear, translation; boxes moved through their corners),
// MixUp, then TrainTransform (HSV jitter, horizontal flip, the letterbox `preproc` with fill 114);
// evaluation is the letterbox alone (ValTransform). Equal to yolox's own functions given the same
// draws (tests/python/test_detection_yolox.py): the pixels byte for byte, since YOLOX's pixel
// arithmetic is OpenCV 4.x's and OpenCV's is reproduced below; the boxes exactly, computed in
// float64 as YOLOX's numpy arrays are and rounded to float32 once, at the end.
//
// Channel order: crucible's images are RGB, YOLOX's (cv2.imread) BGR. Only the HSV jitter sees
// the order (hue is measured from red); its conversions read red and blue from their places in
// RGB, which gives the HSV values cv2.COLOR_BGR2HSV gives on the same pixels stored as BGR.
// Torch-free; the functions are pure and the transforms immutable and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "crucible/core/registry.h"
#include "crucible/data/transforms/detection.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

constexpr const char* kYoloxPreset = "yolox";

// The YOLOX preset's keys of [data] (declared through DetectionSettings). The horizontal flip's
// probability is data.hflip (TrainTransform's flip_prob, 0.5 in both).
struct YoloxSettings {
  int64_t size = 640;                      // data.yolox_size: input_size, square
  // data.yolox_mosaic_epochs: the epochs (from 0) with mosaic; later ones run TrainTransform
  // alone. YOLOX turns mosaic off at the start of epoch max_epoch - no_aug_epochs - 1 (trainer.py's
  // before_epoch): 300 - 15 - 1 = 284 with its defaults. The data layer does not know train.epochs.
  int64_t mosaic_epochs = 284;
  double mosaic_prob = 1.0;                // data.yolox_mosaic_prob
  bool mixup = true;                       // data.yolox_mixup (enable_mixup)
  double mixup_prob = 1.0;                 // data.yolox_mixup_prob
  double hsv_prob = 1.0;                   // data.yolox_hsv_prob
  double degrees = 10.0;                   // data.yolox_degrees
  double translate = 0.1;                  // data.yolox_translate
  std::vector<double> mosaic_scale = {0.1, 2.0};  // data.yolox_mosaic_scale
  std::vector<double> mixup_scale = {0.5, 1.5};   // data.yolox_mixup_scale
  double shear = 2.0;                      // data.yolox_shear
  int64_t max_labels = 120;                // data.yolox_max_labels: MosaicDetection's TrainTransform(max_labels=120)
};
void declare_settings(ConfigSchema& schema, YoloxSettings& settings);

// OpenCV 4.x's uint8 arithmetic, as cv2 (opencv-python 4.x) computes it. Hand-written: Debian's
// libopencv would be a dependency for four functions, and its version need not be the one YOLOX
// was trained with.
namespace cv4 {

// cv2.resize(src, (dst_w, dst_h), interpolation=INTER_LINEAR) of a [h, w, channels] image: 11-bit
// fixed-point weights, the horizontal pass in int, the vertical one with OpenCV's rounding
// ((b0 * (S0 >> 4)) >> 16 ...); a downscale by exactly 2 in both axes is INTER_AREA's 2x2 mean.
void resize_linear(const uint8_t* src, int src_w, int src_h, int channels, uint8_t* dst, int dst_w, int dst_h);

// cv2.warpAffine(src, M, (dst_w, dst_h), borderValue=border) of a 3-channel image, INTER_LINEAR:
// M inverted in double, source coordinates in fixed point (1/32 pixel), 15-bit bilinear weights.
void warp_affine(const uint8_t* src, int src_w, int src_h, uint8_t* dst, int dst_w, int dst_h, const double m[6],
                 const uint8_t border[3]);

// cv2.cvtColor(COLOR_BGR2HSV) on the image read as RGB (see above): H in [0, 180), S and V in [0, 255].
void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int width, int height);
// cv2.cvtColor(COLOR_HSV2BGR), written as RGB, as OpenCV computes it on an AVX-512 CPU (the tests'):
// each row in blocks of 64 pixels (4 × 16 float lanes) whose levels it truncates, the rest of the
// row rounded; 1 - s·h and 1 - s·(1 - h) fused. On an AVX2-only CPU OpenCV's blocks are 32 pixels
// (by its source; not measured): a row whose width is a multiple of 64, as 640, is the same there,
// other rows may differ by 1 level between their last multiple of 32 and of 64 pixels.
void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int width, int height);

// augment_hsv's pixels in one pass, in place: rgb_to_hsv, then H + gains[0] modulo 180 (numpy's
// %), S + gains[1] and V + gains[2] clipped to [0, 255], then hsv_to_rgb; the same bytes as the
// three passes.
void hsv_jitter(uint8_t* rgb, int width, int height, const std::array<int, 3>& gains);

// Whether the functions above use their AVX2 loops where the CPU has AVX2 (the default; the same bytes,
// 8 pixels a step): off, the scalar ones everywhere, which tests compare them with. Returns the
// previous setting.
bool use_vector_loops(bool on);

}  // namespace cv4

// A sample in YOLOX's arithmetic: RGB [height, width, 3] pixels and float64 boxes, as its numpy
// arrays hold them; labels, crowd flags and ids travel with the boxes.
struct YoloxSample {
  std::vector<uint8_t> pixels;
  int width = 0, height = 0;
  std::vector<double> xyxy;  // [n, 4]
  std::vector<int64_t> labels, ids;
  std::vector<uint8_t> iscrowd;
  size_t size() const { return labels.size(); }
  void keep(const std::vector<uint8_t>& keep);  // box i where keep[i] != 0, in order
};
YoloxSample to_yolox(DetectionImage s);    // bad_input unless 3 channels
DetectionImage from_yolox(YoloxSample s);  // boxes rounded to float32

// Where YOLOX's draws come from: Python's random.random(), random.uniform and random.randint,
// and numpy's np.random.uniform and np.random.randint, one value per call (an array of 3 is 3
// calls). Training draws from the sample's own stream (StreamDraws); the tests replay a list
// (ReplayDraws) that they hand, value for value, to yolox's patched random and np.random, so
// that a draw made in another order or another number of times shows.
class YoloxDraws {
 public:
  virtual ~YoloxDraws() = default;
  virtual double random() = 0;                          // [0, 1)
  virtual double uniform(double lo, double hi) = 0;     // [lo, hi)
  virtual int64_t randint(int64_t lo, int64_t hi) = 0;  // [lo, hi], both ends (np.random.randint(lo, hi + 1))
};

// From `rng`: random() its 24-bit uniform, uniform(lo, hi) = lo + (hi - lo) random() in double,
// randint unbiased from 64 bits. With `record`, every value drawn is appended to it.
class StreamDraws final : public YoloxDraws {
 public:
  explicit StreamDraws(SampleRng& rng, std::vector<double>* record = nullptr) : rng_(rng), record_(record) {}
  double random() override;
  double uniform(double lo, double hi) override;
  int64_t randint(int64_t lo, int64_t hi) override;

 private:
  double keep(double v);
  SampleRng& rng_;
  std::vector<double>* record_;
};

// `values` in order; bad_input when they run out or a randint value is outside its range.
class ReplayDraws final : public YoloxDraws {
 public:
  explicit ReplayDraws(std::vector<double> values) : values_(std::move(values)) {}
  double random() override { return next("random"); }
  double uniform(double, double) override { return next("uniform"); }
  int64_t randint(int64_t lo, int64_t hi) override;
  size_t left() const { return values_.size() - used_; }

 private:
  double next(const char* what);
  std::vector<double> values_;
  size_t used_ = 0;
};

namespace yolox {

// COCODataset.pull_item: the image resized (INTER_LINEAR) by r = min(h_in / h, w_in / w) to
// (int(w r), int(h r)), its boxes × r (load_anno_from_ids' res[:, :4] *= r). No padding.
void fit(YoloxSample& s, int input_h, int input_w);

// preproc(img, input_size): the image resized as fit() does and placed at the top left of an
// input_h × input_w canvas of 114; boxes × r. Returns r.
double letterbox(YoloxSample& s, int input_h, int input_w);

// augment_hsv's arithmetic with the gains it drew (hsv_augs, after astype(int16)): H + dh modulo
// 180, S + ds and V + dv clipped to [0, 255], through OpenCV's uint8 HSV.
void augment_hsv(YoloxSample& s, const std::array<int, 3>& gains);
// augment_hsv's draws: np.random.uniform(-1, 1, 3) × gain, × np.random.randint(0, 2, 3),
// truncated towards 0. `uniform` and `select` receive the draws themselves.
std::array<int, 3> draw_hsv_gains(YoloxDraws& draws, const std::array<double, 3>& gain, std::array<double, 3>* uniform,
                                  std::array<int, 3>* select);

// _mirror: the image mirrored, boxes[:, 0::2] = width - boxes[:, 2::-2].
void mirror(YoloxSample& s);

// get_affine_matrix's draws (get_aug_params): the angle and the shears in degrees, the scale, and
// the translations as fractions of the target size.
struct AffineParams {
  double angle = 0, scale = 1, shear_x = 0, shear_y = 0, translate_x = 0, translate_y = 0;
};
AffineParams draw_affine(YoloxDraws& draws, double degrees, double translate, double scale_lo, double scale_hi,
                         double shear);
// get_affine_matrix's M (2 × 3, row-major) for a target_w × target_h output.
std::array<double, 6> affine_matrix(const AffineParams& p, int target_w, int target_h);
// random_affine: cv2.warpAffine(img, M, (target_w, target_h), borderValue=114) and
// apply_affine_to_bboxes (the 4 corners through M, their extent clipped to the target). 0.3.0
// drops no box here: a box moved outside is left with no width or height, and TrainTransform
// drops it.
void random_affine(YoloxSample& s, const AffineParams& p, int target_w, int target_h);

// MosaicDetection's 4-image canvas: tiles[0] is the sample, tiles 1–3 the ones drawn; each as
// pull_item gives it (fit()). The canvas is 2 input_h × 2 input_w, filled with 114, centred at
// (xc, yc); each tile is resized by min(input_h / h, input_w / w) and placed by
// get_mosaic_coordinate; its boxes × that scale + the tile's offset, then every box clipped to the
// canvas.
YoloxSample mosaic(const std::array<const YoloxSample*, 4>& tiles, int xc, int yc, int input_h, int input_w);

// MosaicDetection.mixup's draws, the image's index aside: jit_factor, FLIP, and the crop's
// offsets (drawn y first, 0 where the jittered image does not overhang the target).
struct MixupParams {
  double jit = 1;
  bool flip = false;
  int x_offset = 0, y_offset = 0;
};
// The offsets' draws for a jittered input_h × input_w canvas over a target_h × target_w image.
void draw_mixup_offsets(YoloxDraws& draws, MixupParams* p, int input_h, int input_w, int target_h, int target_w);
// mixup(origin_img, origin_labels, input_dim) with `other` as pull_item gives it: `other`
// letterboxed into input_h × input_w, resized by jit (cv2.resize), mirrored under flip, padded
// with 0 and cropped at the offsets to the origin's size, its boxes clipped likewise; the images
// blended 0.5 / 0.5 in float32 and truncated to uint8; the boxes appended.
void mixup(YoloxSample& origin, YoloxSample other, const MixupParams& p, int input_h, int input_w);

// TrainTransform(max_labels, flip_prob, hsv_prob)'s draws: random() < hsv_prob, augment_hsv's,
// then _mirror's random() < flip_prob. None for a sample without boxes (TrainTransform returns
// before drawing).
struct TrainParams {
  bool hsv = false;
  std::array<int, 3> gains = {0, 0, 0};
  std::array<double, 3> hsv_uniform = {0, 0, 0};
  std::array<int, 3> hsv_select = {0, 0, 0};
  bool flip = false;
};
TrainParams draw_train(YoloxDraws& draws, const YoloxSample& s, double hsv_prob, double flip_prob);
// TrainTransform.__call__: HSV and flip, the letterbox, boxes of width and height > 1 (after × r)
// kept; when none is left, the letterbox of the sample as it came, with all its boxes; at most
// max_labels boxes.
void train_transform(YoloxSample& s, const TrainParams& p, int input_h, int input_w, int max_labels);

}  // namespace yolox

// The training transform of the "yolox" preset: MosaicDetection.__getitem__ with its
// TrainTransform, drawing from the sample's stream: with mosaic (epoch < mosaic_epochs and
// random() < mosaic_prob) the sample and 3 drawn uniformly from the data set on the canvas, then
// random_affine, then MixUp (when there are boxes and random() < mixup_prob) with a drawn sample
// that has boxes; TrainTransform last. Every sample it reads is first what COCODataset.pull_item
// gives: its crowd boxes dropped (YOLOX loads annotations with iscrowd=False) and fit().
class YoloxTrain final : public DetectionTransform {
 public:
  YoloxTrain(YoloxSettings settings, double flip_prob);
  void apply(DetectionImage& s, SampleRng& rng) const override;  // logic_error: it reads other samples
  void apply(DetectionImage& s, SampleRng& rng, const DetectionContext& context) const override;
  // The same with the draws from `draws` (apply: a StreamDraws of the sample's stream).
  void run(DetectionImage& s, YoloxDraws& draws, const DetectionContext& context) const;
  std::string describe() const override;

 private:
  YoloxSample mosaic_and_mix(YoloxSample s, YoloxDraws& draws, const DetectionContext& context) const;

  YoloxSettings o_;
  double flip_prob_;
};

// ValTransform's letterbox as COCODataset serves it: fit() then preproc to size × size.
class YoloxLetterbox final : public DetectionTransform {
 public:
  explicit YoloxLetterbox(int size);
  void apply(DetectionImage& s, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  int size_;
};

// The YOLOX operations' functional forms (detection_op_registry, src/data/transforms/detection_ops.cpp).
void add_yolox_ops(Registry<DetectionOp>& registry);

}  // namespace crucible::data
