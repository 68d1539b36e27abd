// `crucible preview` of a detection set (data.dataset = "detection"): the first training images
// of epoch 0 as the loader gives them — after data.detection_preset's transforms (mosaic
// included), with the seeds and the order a training run would use — in a grid, each box drawn in
// its class's colour with the class name at its corner, the image id under the tile. The boxes
// themselves (in the augmented image's pixels) are in the PNG's tEXt chunk "crucible.boxes".
// Torch-free: the detection data need no device.
#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/commands/preview.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/core/rng.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/data_setup.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/transforms/detection_presets.h"
#include "crucible/data/transforms/transform.h"
#include "crucible/obs/draw.h"

namespace crucible::commands {
namespace {

using obs::class_colour;
using obs::draw_rect;
using obs::draw_text;
using obs::encode_png;
using obs::fill_rect;

struct Tile {
  std::vector<uint8_t> rgb;  // [height, width, 3], as the loader gave it
  int64_t width = 0, height = 0, image_id = -1, sample = -1;
  std::vector<float> boxes;
  std::vector<int64_t> labels;
};

// The first `n` images of epoch 0 from the training loader a run with `config` would build.
std::vector<Tile> first_images(const train::JobConfig& config, int64_t n, PreviewSummary& s,
                               std::vector<std::string>* names) {
  const auto seed = static_cast<uint64_t>(config.run.seed);
  const data::DataSetup ds = data::make_data(config.data, derive_seed(seed, RngStream::kAugment), false);
  *names = ds.train->class_names();  // COCO's categories, YOLO's classes.txt
  data::SamplerBuild order;
  order.size = ds.train->size();
  order.seed = derive_seed(seed, RngStream::kSampler);
  order.batch = config.train.batch_size;
  order.shard_counts = ds.train->shard_counts();
  data::LoaderOptions o = data::loader_options(config.data, config.train.batch_size,
                                               std::max<int>(1, static_cast<int>(config.data.threads)));
  data::Loader loader(ds.train, data::make_training_sampler(config.data, order), o);
  loader.start_epoch(0);
  std::vector<Tile> tiles;
  while (static_cast<int64_t>(tiles.size()) < n) {
    std::optional<data::Batch> b = loader.next();
    if (!b) break;
    ++s.batches;
    const int64_t H = b->spec.height, W = b->spec.width;
    for (int64_t i = 0; i < b->size() && static_cast<int64_t>(tiles.size()) < n; ++i) {
      Tile t;
      t.height = b->image_sizes[static_cast<size_t>(2 * i)];
      t.width = b->image_sizes[static_cast<size_t>(2 * i + 1)];
      t.image_id = b->image_ids[static_cast<size_t>(i)];
      t.sample = b->sample_ids[static_cast<size_t>(i)];
      t.rgb.resize(static_cast<size_t>(t.width * t.height * 3));
      for (int64_t y = 0; y < t.height; ++y) {
        std::copy_n(b->pixels.data() + ((i * H + y) * W) * 3, t.width * 3, t.rgb.data() + y * t.width * 3);
      }
      const auto from = static_cast<size_t>(b->box_offsets[static_cast<size_t>(i)]);
      const auto to = static_cast<size_t>(b->box_offsets[static_cast<size_t>(i + 1)]);
      t.boxes.assign(b->boxes.begin() + 4 * from, b->boxes.begin() + 4 * to);
      t.labels.assign(b->box_labels.begin() + from, b->box_labels.begin() + to);
      tiles.push_back(std::move(t));
    }
  }
  return tiles;
}

}  // namespace

PreviewSummary preview_detection(const train::JobConfig& config, const PreviewOptions& options) {
  PreviewSummary s;
  std::vector<std::string> names;
  const std::vector<Tile> tiles = first_images(config, options.n, s, &names);
  if (tiles.empty()) throw bad_input("preview: the training data gave no images");
  s.samples = static_cast<int64_t>(tiles.size());
  int64_t largest = 0;
  for (const Tile& t : tiles) largest = std::max({largest, t.width, t.height});
  const int64_t cell = std::min<int64_t>(largest, 320);  // a tile's longer side
  const int scale = cell >= 160 ? 2 : 1;
  const int64_t strip = 7 * scale, gap = 2;
  s.columns = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(s.samples))));
  s.rows = (s.samples + s.columns - 1) / s.columns;
  s.width = s.columns * (cell + gap) + gap;
  s.height = s.rows * (cell + strip + gap) + gap;
  std::vector<uint8_t> rgb(static_cast<size_t>(s.width * s.height * 3), 32);
  nlohmann::json boxes_json = nlohmann::json::array();
  for (int64_t k = 0; k < s.samples; ++k) {
    const Tile& t = tiles[static_cast<size_t>(k)];
    const double f = static_cast<double>(cell) / static_cast<double>(std::max(t.width, t.height));
    const int w = std::max(1, static_cast<int>(std::lround(t.width * f)));
    const int h = std::max(1, static_cast<int>(std::lround(t.height * f)));
    std::vector<uint8_t> small(static_cast<size_t>(w * h * 3));
    data::resize_image(t.rgb.data(), static_cast<int>(t.width), static_cast<int>(t.height),
                       static_cast<int>(t.width * 3), 3, small.data(), w, h);
    const int64_t x0 = gap + (k % s.columns) * (cell + gap), y0 = gap + (k / s.columns) * (cell + strip + gap);
    for (int y = 0; y < h; ++y) std::copy_n(small.data() + y * w * 3, w * 3, rgb.data() + ((y0 + y) * s.width + x0) * 3);
    nlohmann::json tile = {{"image_id", t.image_id}, {"sample", t.sample}, {"width", t.width}, {"height", t.height},
                           {"boxes", nlohmann::json::array()}, {"labels", t.labels}};
    for (size_t i = 0; i < t.labels.size(); ++i) {
      const float* b = &t.boxes[4 * i];
      tile["boxes"].push_back({b[0], b[1], b[2], b[3]});
      uint8_t colour[3];
      class_colour(t.labels[i], colour);
      const int64_t x1 = x0 + std::lround(b[0] * f), y1 = y0 + std::lround(b[1] * f);
      const int64_t x2 = x0 + std::max<int64_t>(std::lround(b[2] * f), std::lround(b[0] * f) + 1);
      const int64_t y2 = y0 + std::max<int64_t>(std::lround(b[3] * f), std::lround(b[1] * f) + 1);
      draw_rect(rgb, s.width, s.height, x1, y1, std::min(x2, x0 + w), std::min(y2, y0 + h), scale, colour);
      const size_t label = static_cast<size_t>(t.labels[i]);
      const std::string name = label < names.size() ? names[label] : std::to_string(t.labels[i]);
      const int64_t text_w = static_cast<int64_t>(name.size()) * 4 * scale + scale;
      fill_rect(rgb, s.width, s.height, x1, y1, std::min(x1 + text_w, x0 + w), std::min(y1 + 6 * scale, y0 + h), colour);
      static const uint8_t kBlack[3] = {0, 0, 0};
      draw_text(rgb, s.width, x1 + scale, y1 + scale / 2, name, scale, x0 + w, kBlack);
    }
    boxes_json.push_back(tile);
    draw_text(rgb, s.width, x0, y0 + cell + scale, std::to_string(t.image_id), scale, x0 + cell);
  }
  write_file_atomic(options.out, encode_png(rgb, s.width, s.height, "crucible.boxes", boxes_json.dump()));
  log_info("preview: {} training images of epoch 0 ({} batch(es), detection preset {}) → {} ({} per row, {}x{} px)",
           s.samples, s.batches, config.data.pieces.get<data::DetectionSettings>(data::kDetectionPiece).preset,
           options.out, s.columns, s.width, s.height);
  return s;
}

}  // namespace crucible::commands
