// Multi-scale training (M4) as a batch transform: each step's images are resized on the device
// to one of train.multi_scale's sizes, drawn from (seed, step) by multi_scale_size(), so every
// rank trains at the same size at the same step and a resumed step draws what it drew before.
// A detection batch is not resized here: the size is the step's min_size, the shorter side the
// detector's own resize (GeneralizedRCNNTransform) scales each image and its boxes to. That is
// torchvision's multi-scale (a tuple min_size), drawn once per step for all ranks rather than
// per image by each rank.
#include <ATen/ATen.h>

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/loader/loader.h"
#include "crucible/train/job.h"
#include "crucible/train/multi_scale.h"
#include "crucible/train/recipe.h"
#include "crucible/train/schedule.h"

namespace crucible::train {
namespace {

class MultiScale final : public BatchTransform {
 public:
  MultiScale(uint64_t seed, std::vector<int64_t> sizes) : seed_(seed), sizes_(std::move(sizes)) {}

  void apply(DeviceBatch& b) override {
    const int64_t size = multi_scale_size(seed_, b.step, sizes_);
    if (b.detection()) {
      b.min_size = size;
      return;
    }
    if (size != b.images.size(2) || size != b.images.size(3)) {
      b.images = at::upsample_bilinear2d(b.images, {size, size}, /*align_corners=*/false);
    }
  }

  std::string describe() const override { return fmt::format("multi-scale {} px", fmt::join(sizes_, "/")); }
  bool keeps_boxes() const override { return true; }  // a detector resizes the boxes with the image

 private:
  uint64_t seed_;
  std::vector<int64_t> sizes_;
};

}  // namespace

std::unique_ptr<BatchTransform> make_multi_scale(const Job& job) {
  std::vector<int64_t> sizes;
  for (double s : job.config.pieces.get<MultiScaleOptions>(kMultiScalePiece).sizes) {
    if (s != std::floor(s) || s < 4 || s > 4096) {
      throw bad_input("train.multi_scale: {} is not a size in pixels (an integer 4–4096)", s);
    }
    sizes.push_back(static_cast<int64_t>(s));
  }
  if (sizes.empty()) return nullptr;
  const uint64_t seed = static_cast<uint64_t>(job.config.run.seed);
  if (job.detection) {
    const nn::DetectorSettings& m = job.config.model.detector;
    log_info("multi-scale (M4): each step trains at a shorter side of one of {} px (longer side at most model.max_size "
             "= {}), drawn from (seed, step) — the same size on every rank at the same step; evaluation at "
             "model.min_size = {}",
             fmt::join(sizes, ", "), m.max_size, m.min_size);
    return std::make_unique<MultiScale>(seed, std::move(sizes));
  }
  const data::ImageSpec spec = job.train_loader->pipeline().output_spec();
  log_info("multi-scale (M4): each step trains at one of {} px (square), drawn from (seed, step) — the same size on "
           "every rank at the same step; evaluation at {}x{}",
           fmt::join(sizes, ", "), spec.height, spec.width);
  return std::make_unique<MultiScale>(seed, std::move(sizes));
}

}  // namespace crucible::train
