// write_eval_images (see eval_images.h): detect, draw, encode.
#include "crucible/train/eval_images.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/file.h"
#include "crucible/data/transforms/transform.h"
#include "crucible/data/loader/loader.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/obs/draw.h"
#include "crucible/train/detection_eval.h"

namespace crucible::train {
namespace {

struct Tile {
  std::vector<uint8_t> rgb;  // [height, width, 3]
  int64_t width = 0, height = 0, image_id = -1;
  nlohmann::json truth = nlohmann::json::array(), detections = nlohmann::json::array();
};

// Image j of `b` with its true boxes, and the detector's detections of it.
Tile tile_of(nn::Detector& detector, const data::Batch& b, int64_t j, c10::Device device) {
  Tile t;
  t.height = b.image_sizes[static_cast<size_t>(2 * j)];
  t.width = b.image_sizes[static_cast<size_t>(2 * j + 1)];
  t.image_id = b.image_ids[static_cast<size_t>(j)];
  const at::Tensor img = detection_image(b, j, device);  // [3, h, w] 0–1
  const at::Tensor hwc = img.mul(255.0).round_().clamp_(0, 255).to(at::kByte).permute({1, 2, 0}).contiguous().cpu();
  t.rgb.assign(hwc.data_ptr<uint8_t>(), hwc.data_ptr<uint8_t>() + hwc.numel());
  for (int64_t k = b.box_offsets[static_cast<size_t>(j)]; k < b.box_offsets[static_cast<size_t>(j + 1)]; ++k) {
    const float* x = &b.boxes[static_cast<size_t>(4 * k)];
    t.truth.push_back({x[0], x[1], x[2], x[3], b.box_labels[static_cast<size_t>(k)],
                       b.box_crowd.empty() ? 0 : static_cast<int>(b.box_crowd[static_cast<size_t>(k)])});
  }
  // Outside the step: the report's drawing reads its detections on the host.
  const nn::Detections d = detector.detect({img})[0];
  const at::Tensor boxes = d.boxes.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor scores = d.scores.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor labels = d.labels.to(at::kCPU, at::kLong).contiguous();
  for (int64_t k = 0; k < scores.size(0); ++k) {
    const float* x = boxes.data_ptr<float>() + 4 * k;
    t.detections.push_back({x[0], x[1], x[2], x[3], labels.data_ptr<int64_t>()[k], scores.data_ptr<float>()[k]});
  }
  return t;
}

// One tile drawn at (x0, y0), its longer side `cell` px: true boxes white, the best detections
// (options) in their class's colour with "name score".
void draw_tile(std::vector<uint8_t>& rgb, int64_t width, int64_t height, const Tile& t, int64_t x0, int64_t y0,
               int64_t cell, int scale, const EvalImagesOptions& options, const std::vector<std::string>& names) {
  const double f = static_cast<double>(cell) / static_cast<double>(std::max(t.width, t.height));
  const int w = std::max(1, static_cast<int>(std::lround(t.width * f)));
  const int h = std::max(1, static_cast<int>(std::lround(t.height * f)));
  std::vector<uint8_t> small(static_cast<size_t>(w * h * 3));
  data::resize_image(t.rgb.data(), static_cast<int>(t.width), static_cast<int>(t.height), static_cast<int>(t.width * 3),
                     3, small.data(), w, h);
  for (int y = 0; y < h; ++y) std::copy_n(small.data() + y * w * 3, w * 3, rgb.data() + ((y0 + y) * width + x0) * 3);
  const auto rect = [&](const nlohmann::json& b, const uint8_t colour[3], int thickness) {
    const double bx1 = b[0].get<double>() * f, by1 = b[1].get<double>() * f;
    const double bx2 = b[2].get<double>() * f, by2 = b[3].get<double>() * f;
    const int64_t x1 = x0 + std::lround(bx1), y1 = y0 + std::lround(by1);
    const int64_t x2 = x0 + std::max<int64_t>(std::lround(bx2), std::lround(bx1) + 1);
    const int64_t y2 = y0 + std::max<int64_t>(std::lround(by2), std::lround(by1) + 1);
    obs::draw_rect(rgb, width, height, x1, y1, std::min<int64_t>(x2, x0 + w), std::min<int64_t>(y2, y0 + h), thickness,
                   colour);
    return std::make_pair(x1, y1);
  };
  static const uint8_t kWhite[3] = {255, 255, 255}, kBlack[3] = {0, 0, 0};
  for (const auto& b : t.truth) rect(b, kWhite, 1);
  int64_t drawn = 0;
  for (const auto& d : t.detections) {  // best first
    const double score = d[5].get<double>();
    if (score < options.min_score || drawn++ >= options.max_drawn) break;
    uint8_t colour[3];
    const int64_t label = d[4].get<int64_t>();
    obs::class_colour(label, colour);
    const auto [x1, y1] = rect(d, colour, scale);
    const std::string name = label >= 0 && static_cast<size_t>(label) < names.size() ? names[static_cast<size_t>(label)]
                                                                                      : std::to_string(label);
    const std::string text = fmt::format("{} {:.2f}", name, score);
    const int64_t text_w = static_cast<int64_t>(text.size()) * 4 * scale + scale;
    obs::fill_rect(rgb, width, height, x1, y1, std::min(x1 + text_w, x0 + w), std::min(y1 + 6 * scale, y0 + h), colour);
    obs::draw_text(rgb, width, x1 + scale, y1 + scale / 2, text, scale, x0 + w, kBlack);
  }
  obs::draw_text(rgb, width, x0, y0 + cell + scale, std::to_string(t.image_id), scale, x0 + cell);
}

}  // namespace

int64_t write_eval_images(nn::Detector& detector, data::Loader& test_loader, c10::Device device,
                          const std::string& path, const EvalImagesOptions& options) {
  std::vector<Tile> tiles;
  {
    nn::EvalGuard eval(detector);
    at::NoGradGuard no_grad;
    test_loader.start_epoch(0);
    while (static_cast<int64_t>(tiles.size()) < options.images) {
      std::optional<data::Batch> b = test_loader.next();
      if (!b) break;
      for (int64_t j = 0; j < b->size() && static_cast<int64_t>(tiles.size()) < options.images; ++j) {
        tiles.push_back(tile_of(detector, *b, j, device));
      }
    }
  }
  if (tiles.empty()) return 0;
  const std::vector<std::string> names = test_loader.pipeline().class_names();
  int64_t largest = 0;
  for (const Tile& t : tiles) largest = std::max({largest, t.width, t.height});
  const int64_t cell = std::min<int64_t>(largest, 320), n = static_cast<int64_t>(tiles.size());
  const int scale = cell >= 160 ? 2 : 1;
  const int64_t strip = 7 * scale, gap = 2, columns = std::min<int64_t>(4, n), rows = (n + columns - 1) / columns;
  const int64_t width = columns * (cell + gap) + gap, height = rows * (cell + strip + gap) + gap;
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3), 32);
  nlohmann::json chunk = nlohmann::json::array();
  for (int64_t k = 0; k < n; ++k) {
    const Tile& t = tiles[static_cast<size_t>(k)];
    draw_tile(rgb, width, height, t, gap + (k % columns) * (cell + gap), gap + (k / columns) * (cell + strip + gap),
              cell, scale, options, names);
    chunk.push_back({{"image_id", t.image_id}, {"width", t.width}, {"height", t.height}, {"truth", t.truth},
                     {"detections", t.detections}});
  }
  write_file_atomic(path, obs::encode_png(rgb, width, height, "crucible.eval_boxes", chunk.dump()));
  return n;
}

}  // namespace crucible::train
