// `crucible preview` (commands/preview.h): the training pipeline and the recipe's batch
// transforms, as the trainer runs them, to a PNG grid (obs/draw.h draws the text and writes
// the PNG; preview_detection.cpp draws a detection set's boxes).
#include "crucible/commands/preview.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/train/batch_transform.h"
#include "crucible/train/job.h"
#include "crucible/train/multi_scale.h"
#include "crucible/train/recipe.h"
#include "crucible/train/session.h"
#include "crucible/train/step.h"
#include "crucible/obs/draw.h"

namespace crucible::commands {
namespace {

using obs::draw_text;
using obs::encode_png;

// The PNG's pixels and labels: tiles ([C, H, W] uint8) in a near-square grid with 2-pixel gaps,
// a label strip under each (its class, or the two largest shares of a mixed target); fills in
// the grid's size in `s`.
struct Grid {
  std::vector<uint8_t> rgb;
  nlohmann::json labels = nlohmann::json::array();
};
Grid compose_grid(const std::vector<at::Tensor>& tiles, const std::vector<at::Tensor>& targets, PreviewSummary& s) {
  const int64_t channels = tiles[0].size(0), h = tiles[0].size(1), w = tiles[0].size(2);
  Grid g;
  const int scale = w >= 96 ? 2 : 1;
  const int64_t strip = 7 * scale, gap = 2;
  s.columns = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(s.samples))));
  s.rows = (s.samples + s.columns - 1) / s.columns;
  const int64_t cell_w = w + gap, cell_h = h + strip + gap;
  s.width = s.columns * cell_w + gap;
  s.height = s.rows * cell_h + gap;
  g.rgb.assign(static_cast<size_t>(s.width * s.height * 3), 32);  // dark grey background
  for (int64_t k = 0; k < s.samples; ++k) {
    const int64_t x0 = gap + (k % s.columns) * cell_w, y0 = gap + (k / s.columns) * cell_h;
    const at::Tensor hwc = tiles[static_cast<size_t>(k)].permute({1, 2, 0}).contiguous();
    const uint8_t* p = hwc.data_ptr<uint8_t>();
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const uint8_t* src = p + (y * w + x) * channels;
        uint8_t* dst = g.rgb.data() + ((y0 + y) * s.width + x0 + x) * 3;
        for (int c = 0; c < 3; ++c) dst[c] = src[channels == 3 ? c : 0];
      }
    }
    // The label: the class, or the two largest shares of a mixed target.
    const at::Tensor t = targets[static_cast<size_t>(k)];
    const auto top = t.topk(std::min<int64_t>(2, t.size(0)));
    const at::Tensor v = std::get<0>(top), idx = std::get<1>(top);
    std::string text = std::to_string(idx[0].item<int64_t>());
    nlohmann::json shares = nlohmann::json::object();
    shares[std::to_string(idx[0].item<int64_t>())] = v[0].item<double>();
    if (t.size(0) > 1 && v[1].item<float>() > 0) {
      text += '+';
      text += std::to_string(idx[1].item<int64_t>());
      shares[std::to_string(idx[1].item<int64_t>())] = v[1].item<double>();
    }
    g.labels.push_back(shares);
    draw_text(g.rgb, s.width, x0, y0 + h + scale, text, scale, x0 + w);
  }
  return g;
}

}  // namespace

PreviewSummary preview(const train::JobConfig& config, const PreviewOptions& options) {
  if (options.n < 1) throw bad_input("preview: --n must be at least 1, found {}", options.n);
  if (options.out.size() < 5 || options.out.substr(options.out.size() - 4) != ".png") {
    throw bad_input("preview: --out must name a .png file, found \"{}\"", options.out);
  }
  if (config.data.dataset == data::DataConfig::Dataset::kDetection) return preview_detection(config, options);
  // The training data as the trainer builds it (join_job + the data stages: the same pipelines,
  // sampler and seeds), and the recipe's batch transforms but multi-scale (the tiles keep the
  // crop's size).
  train::JobConfig c = config;
  PreviewSummary s;
  std::vector<double>& sizes = c.pieces.of<train::MultiScaleOptions>(train::kMultiScalePiece).sizes;
  if (!sizes.empty()) {
    s.not_applied.emplace_back("train.multi_scale",
                               fmt::format("the tiles keep data.crop's size ({} pixels)", config.data.crop));
    log_warn("preview: train.multi_scale = [{}] is not applied: {}", fmt::join(sizes, ", "),
             s.not_applied.back().second);
    sizes.clear();
  }
  const std::unique_ptr<train::Session> session = train::Session::open_preview(std::move(c));
  train::Job* job = &session->job();
  const data::ImageSpec spec = job->train_loader->pipeline().output_spec();
  if (spec.type != data::SampleType::kPixels) {
    throw bad_input("preview: the training data are float features ({}), not pixels: there is nothing to draw",
                    spec.to_string());
  }
  const train::BatchTransforms transforms = train::make_batch_transforms(*job);
  const data::DeviceInput input(spec, train::normalize_options(job->config), job->device, false);
  const data::InputConvention conv = input.delivers();
  const int64_t channels = spec.channels, h = spec.height, w = spec.width;
  const auto on_device = at::TensorOptions().dtype(at::kFloat).device(job->device);
  const at::Tensor mean = at::tensor(conv.mean, at::kDouble).to(on_device).view({1, channels, 1, 1});
  const at::Tensor stdv = at::tensor(conv.std, at::kDouble).to(on_device).view({1, channels, 1, 1});

  std::vector<at::Tensor> tiles;    // [C, H, W] uint8 each
  std::vector<at::Tensor> targets;  // [classes] float each
  job->train_loader->start_epoch(0);
  for (int64_t step = 0; static_cast<int64_t>(tiles.size()) < options.n; ++step) {
    std::optional<data::Batch> batch = job->train_loader->next();
    if (!batch) break;
    ++s.batches;
    train::DeviceBatch b;
    b.images = input.images(*batch);
    b.targets = input.labels(*batch);
    b.step = step;
    b.rank = job->world.rank;
    b.epoch = 0;
    b.sample_ids = batch->sample_ids;
    b.copies = batch->copies;
    train::apply_batch_transforms(transforms, b);
    s.mixed = s.mixed || b.targets.dim() == 2;
    const at::Tensor pixels =  // un-normalised, on the host
        b.images.contiguous().mul(stdv).add(mean).mul(255).round().clamp(0, 255).to(at::kByte).cpu();
    const at::Tensor t = (b.targets.dim() == 2 ? b.targets.to(at::kFloat)
                                               : at::one_hot(b.targets, job->num_classes).to(at::kFloat))
                             .cpu();
    for (int64_t i = 0; i < pixels.size(0) && static_cast<int64_t>(tiles.size()) < options.n; ++i) {
      tiles.push_back(pixels[i]);
      targets.push_back(t[i]);
    }
  }
  s.samples = static_cast<int64_t>(tiles.size());
  if (s.samples == 0) throw bad_input("preview: the training data gave no samples");

  const Grid grid = compose_grid(tiles, targets, s);
  write_file_atomic(options.out, encode_png(grid.rgb, s.width, s.height, "crucible.labels", grid.labels.dump()));
  log_info("preview: {} training samples of epoch 0 ({} batch(es){}) → {} ({}x{} tiles in a {}x{} grid, {}x{} px)",
           s.samples, s.batches,
           transforms.empty() ? "" : fmt::format(", after {}", [&] {
             std::string d;
             for (const auto& t : transforms) d += (d.empty() ? "" : ", ") + t->describe();
             return d;
           }()),
           options.out, w, h, s.columns, s.rows, s.width, s.height);
  return s;
}

}  // namespace crucible::commands
