// bench loader / bench decode / pack.
#include "data_commands.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/rng.h"
#include "crucible/core/sha256.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/formats/pack.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/data_config.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/data_setup.h"
#include "crucible/data/data_settings.h"
#include "crucible/data/samplers/grouped_sampler.h"

namespace crucible::cli {

CLI::App* add_bench_loader(CLI::App& bench, BenchLoaderArgs& a) {
  CLI::App* cmd = bench.add_subcommand(
      "loader", "time the data pipeline alone, after warm-up (X9): images/s, and a digest of every batch");
  cmd->add_option("--data", a.data,
                  "an image folder, tar shard(s), an LMDB folder, a packed index, or a folder of IDX files "
                  "(train-images-idx3-ubyte[.gz]); default: the data the [data] keys name, as training opens them");
  cmd->add_option("--crop", a.crop, "output side for images (RandomResizedCrop): data.crop")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", a.threads, "loader threads: data.threads (0 = measured, D10)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--epochs", a.epochs, "passes over the data")->check(CLI::PositiveNumber);
  cmd->add_option("--batch-size", a.batch_size, "samples per batch")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a.warmup, "batches before the clock starts (default 5% of an epoch, >= 2)");
  cmd->add_option("--split-at", a.split_at,
                  "after this many batches of the first epoch, drop the loader and resume a new one from the saved "
                  "position (the digest must not change)");
  cmd->add_flag("--eval", a.eval, "evaluation transforms (resize + centre crop) instead of training ones");
  cmd->add_flag("--digest", a.digest,
                "SHA-256 over every batch's pixels and labels, in order (a detection batch's: its images' sizes and "
                "ids, boxes, box labels and crowd flags too)");
  cmd->add_flag("--json", a.json,
                "print one JSON object as the last line (with `settings`, every [data] key's value, and "
                "`not_applied`, the keys given that a loader run does not apply, with why)");
  cmd->add_option("--set", a.overrides,
                  "override a [data] key or run.seed, e.g. --set data.bad_samples=skip: it wins over this command's "
                  "defaults, and an option given that it contradicts (--crop 96 --set data.crop=128) is refused")
      ->type_name("KEY=VALUE");
  return cmd;
}

CLI::App* add_bench_decode(CLI::App& bench, BenchDecodeArgs& a) {
  CLI::App* cmd = bench.add_subcommand(
      "decode", "full-resolution decode rate of a sample source's images, read into RAM first: the limit a "
                "loader that decodes every pixel cannot pass");
  cmd->add_option("--data", a.data, "an image folder, tar shard(s), an LMDB folder or a packed index")->required();
  cmd->add_option("--threads", a.threads, "decoding threads (each decodes whole images, D7)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--limit", a.limit, "decode at most this many samples");
  cmd->add_flag("--json", a.json, "print one JSON object as the last line");
  return cmd;
}

int run_bench_decode(const BenchDecodeArgs& a) {
  auto source = data::open_data_path(a.data, data::DataConfig{}, false);
  const int64_t n = a.limit > 0 ? std::min(a.limit, source->size()) : source->size();
  std::vector<std::vector<uint8_t>> bytes(static_cast<size_t>(n));
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    data::EncodedSample s = source->get(i);
    bytes[static_cast<size_t>(i)].assign(s.data, s.data + s.size);
    total += static_cast<int64_t>(s.size);
  }
  std::atomic<int64_t> next{0}, pixels{0}, bad{0};
  const auto t0 = std::chrono::steady_clock::now();
  {
    ThreadPool pool(a.threads);
    std::atomic<int> running{a.threads};
    for (int t = 0; t < a.threads; ++t) {
      pool.submit([&] {
        for (int64_t i; (i = next.fetch_add(1)) < n;) {
          const auto& b = bytes[static_cast<size_t>(i)];
          try {
            data::DecodedImage img = data::decode_image(b.data(), b.size(), "sample");
            pixels += static_cast<int64_t>(img.width) * img.height;
          } catch (const Error&) {
            ++bad;
          }
        }
        --running;
      });
    }
    while (running.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(n - bad.load()) / secs;
  log_info("decoded {} images ({} MiB encoded, {:.1f} Mpixel) in {:.2f} s on {} thread(s): {:.0f} images/s, {:.0f} "
           "Mpixel/s{}",
           n - bad.load(), total >> 20, static_cast<double>(pixels.load()) / 1e6, secs, a.threads, rate,
           static_cast<double>(pixels.load()) / 1e6 / secs, bad.load() > 0 ? fmt::format(" ({} failed)", bad.load()) : "");
  if (a.json) {
    nlohmann::ordered_json j = {{"images_per_s", rate}, {"images", n - bad.load()}, {"seconds", secs},
                                {"threads", a.threads},  {"failed", bad.load()},    {"data", a.data}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

CLI::App* add_pack(CLI::App& app, PackArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "pack", "copy samples into page-aligned, memory-mappable shards with an index (D1, D11)");
  cmd->add_option("src", a.src,
                  "an image folder, tar shard(s), an LMDB folder, a packed index, or a detection set: a COCO "
                  "instances .json or a YOLO images folder (packed with each image's boxes as a JSON target)")
      ->required();
  cmd->add_option("dst", a.dst, "output folder (index.crpk + shard files), or an LMDB folder with --lmdb")->required();
  auto* re = cmd->add_flag("--reencode", a.reencode, "re-encode as JPEG, no side longer than --max-side");
  auto* raw = cmd->add_flag("--raw", a.raw, "store decoded RGB pixels (no decoding when training)");
  re->excludes(raw);
  cmd->add_option("--max-side", a.max_side, "longest side after re-encoding (0 = keep)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--quality", a.quality, "JPEG quality for --reencode")->check(CLI::Range(1, 100));
  cmd->add_flag("--validate", a.validate, "decode every sample; report and leave out the bad ones (D5)");
  cmd->add_flag("--lmdb", a.lmdb, "write an LMDB database instead (label + original bytes per key)");
  cmd->add_option("--threads", a.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--shard-mb", a.shard_mb, "shard size in MiB (fractions too: 0.25 = 256 KiB)")->check(CLI::PositiveNumber);
  cmd->add_option("--align", a.align, "sample alignment in bytes (power of two, >= 64)");
  cmd->add_option("--set", a.overrides,
                  "a [data] key for opening the source, e.g. --set data.images_root=coco/train2017 or "
                  "--set data.bad_boxes=refuse (a detection set's boxes are packed as that policy leaves them)")
      ->type_name("KEY=VALUE");
  return cmd;
}

namespace {

// The [data] keys and run.seed (data/data_settings.h), the --set overrides over them and the
// options given over those.
std::unique_ptr<data::DataSettings> bench_loader_settings(const BenchLoaderArgs& a) {
  auto s = std::make_unique<data::DataSettings>("bench loader", "--set");
  for (const auto& o : a.overrides) s->set(o);
  if (a.crop > 0) s->option(fmt::format("--crop {}", a.crop), fmt::format("data.crop={}", a.crop));
  if (a.threads >= 0) s->option(fmt::format("--threads {}", a.threads), fmt::format("data.threads={}", a.threads));
  if (!a.data.empty()) s->source("--data " + a.data, {{a.eval ? "data.test_path" : "data.train_path", a.data}});
  return s;
}

// The pipeline timed: --data's, or the one the [data] keys name, as training opens it; `path`:
// what it reads.
std::shared_ptr<const data::SamplePipeline> bench_loader_pipeline(const BenchLoaderArgs& a, const data::DataConfig& c,
                                                                  uint64_t seed, std::string* path) {
  if (!a.data.empty() || c.dataset == data::DataConfig::Dataset::kImages ||
      c.dataset == data::DataConfig::Dataset::kDetection) {
    *path = !a.data.empty() ? a.data : a.eval ? c.test_path : c.train_path;
    if (path->empty()) {
      throw bad_input("bench loader: give --data PATH, or data.{} with data.dataset = \"images\"",
                      a.eval ? "test_path" : "train_path");
    }
    return data::make_pipeline_for_path(*path, c, seed, !a.eval);
  }
  *path = a.eval ? c.test_images : c.train_images;
  return data::make_data(c, seed, /*test_only=*/a.eval).train;
}

// The keys given that this run does not apply (data_settings.h), each warned of once: {key: why}.
nlohmann::ordered_json say_not_applied(const BenchLoaderArgs& a, const data::DataSettings& settings,
                                       const data::SamplePipeline& pipeline, const std::string& path) {
  data::LoaderUse use;
  use.train = use.transforms = use.order = !a.eval;
  use.images = dynamic_cast<const data::ImagePipeline*>(&pipeline) != nullptr || pipeline.detection();
  use.detection = pipeline.detection();
  use.remote = data::is_remote_path(path);
  use.eval_switch = "--eval";
  use.normalisation = "normalisation's: the loader delivers uint8 pixels, which training normalises on the device "
                      "(DeviceInput)";
  const nlohmann::ordered_json values = settings.values();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [key, why] : data::not_applied(settings, use)) {
    log_warn("bench loader: {} = {} is not applied: {}", key, values[key].dump(), why);
    out[key] = why;
  }
  return out;
}

// --digest: a batch's pixels and labels; a detection batch's targets too (each image's size and
// id, its boxes, labels and crowd flags).
void digest_batch(const data::Batch& batch, Sha256* digest) {
  auto bytes = [&](const auto& v) { digest->update(v.data(), v.size() * sizeof(v[0])); };
  digest->update(batch.pixels.data(), batch.pixels.size());
  bytes(batch.labels);
  if (!batch.detection) return;
  bytes(batch.image_sizes);
  bytes(batch.image_ids);
  bytes(batch.boxes);
  bytes(batch.box_labels);
  bytes(batch.box_crowd);
  bytes(batch.box_offsets);
}

// The order training visits (data.sampler), or evaluation's sequential one.
std::shared_ptr<const data::Sampler> bench_loader_sampler(const BenchLoaderArgs& a, const data::DataConfig& config,
                                                          const data::SamplePipeline& pipeline, uint64_t run_seed,
                                                          bool remote) {
  const uint64_t seed = derive_seed(run_seed, RngStream::kSampler);
  if (a.eval) return std::make_shared<const data::DistributedSampler>(pipeline.size(), /*shuffle=*/false, seed);
  data::SamplerBuild order;
  order.size = pipeline.size();
  order.seed = seed;
  order.batch = a.batch_size;
  order.shard_counts = pipeline.shard_counts();
  order.remote = remote;
  order.aspect_ratios = data::aspect_ratios_of(pipeline);  // detection: batches grouped by aspect ratio
  return data::make_training_sampler(config, order);
}

}  // namespace

int run_bench_loader(const BenchLoaderArgs& a) {
  const std::unique_ptr<data::DataSettings> settings = bench_loader_settings(a);
  const data::DataConfig& config = settings->data();
  const auto run_seed = static_cast<uint64_t>(settings->seed());
  std::string path;
  auto pipeline = bench_loader_pipeline(a, config, derive_seed(run_seed, RngStream::kAugment), &path);
  const nlohmann::ordered_json not_applied = say_not_applied(a, *settings, *pipeline, path);
  int threads = static_cast<int>(config.threads);
  std::string chosen;
  if (threads == 0) threads = data::choose_loader_threads(*pipeline, available_cores(), &chosen);
  log_info("data: {} samples; {}", pipeline->size(), pipeline->describe());
  log_info("loader: {}, batch {}, prefetch {}, bad samples: {}",
           chosen.empty() ? fmt::format("{} thread(s)", threads) : chosen, a.batch_size, config.prefetch,
           data::bad_sample_policy_name(config.bad_samples));
  const std::shared_ptr<const data::Sampler> sampler =
      bench_loader_sampler(a, config, *pipeline, run_seed, data::is_remote_path(path));
  const data::LoaderOptions options = data::loader_options(config, a.batch_size, threads);
  auto make_loader = [&] { return std::make_unique<data::Loader>(pipeline, sampler, options); };
  auto loader = make_loader();
  const int64_t per_epoch = loader->batches_per_epoch();
  const int64_t warmup = a.warmup >= 0 ? a.warmup : std::max<int64_t>(2, per_epoch / 20);
  Sha256 digest;
  int64_t batches = 0, images = 0, timed_images = 0, skipped = 0;
  std::vector<std::string> skipped_names;
  data::ImageSpec shape = pipeline->output_spec();  // the first batch's samples
  auto clock_start = std::chrono::steady_clock::now();
  bool timing = warmup == 0;
  for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
    loader->start_epoch(epoch);
    for (;;) {
      if (epoch == 0 && a.split_at >= 0 && batches == a.split_at) {
        // A save/restore in mid-epoch: the saved position is (epoch, batch); a new loader resumes.
        skipped += loader->skipped_count();
        skipped_names.insert(skipped_names.end(), loader->skipped_names().begin(), loader->skipped_names().end());
        loader = make_loader();
        loader->start_epoch(epoch, a.split_at);
      }
      auto batch = loader->next();
      if (!batch) break;
      if (batches == 0) shape = batch->spec;
      ++batches;
      images += batch->size();
      if (timing) timed_images += batch->size();
      if (a.digest) digest_batch(*batch, &digest);
      if (!timing && batches == warmup) {
        timing = true;
        clock_start = std::chrono::steady_clock::now();
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  skipped += loader->skipped_count();
  skipped_names.insert(skipped_names.end(), loader->skipped_names().begin(), loader->skipped_names().end());
  const double rate = secs > 0 && timing ? static_cast<double>(timed_images) / secs : 0.0;
  const std::string hex = a.digest ? digest.hex_digest() : "";
  for (const auto& s : skipped_names) log_warn("skipped: {}", s);
  log_info("{} images in {} batches; {:.0f} images/s over {} timed images ({:.2f} s after {} warm-up batches){}{}",
           images, batches, rate, timed_images, secs, warmup, skipped > 0 ? fmt::format("; {} skipped", skipped) : "",
           a.digest ? "; digest " + hex : "");
  if (a.json) {
    const int64_t crop = !a.eval || config.eval_crop == 0 ? config.crop : config.eval_crop;
    nlohmann::ordered_json j = {{"images_per_s", rate},   {"images", images},     {"timed_images", timed_images},
                                {"seconds", secs},        {"batches", batches},   {"threads", threads},
                                {"prefetch", options.prefetch},
                                {"crop", not_applied.contains("data.crop") ? nlohmann::ordered_json(nullptr)
                                                                           : nlohmann::ordered_json(crop)},
                                {"sample_shape", {shape.channels, shape.height, shape.width}},
                                {"epochs", a.epochs},     {"batch_size", a.batch_size},
                                {"skipped", skipped},     {"skipped_names", skipped_names},
                                {"digest", a.digest ? nlohmann::ordered_json(hex) : nlohmann::ordered_json(nullptr)},
                                {"data", path},           {"pipeline", pipeline->describe()},
                                {"settings", settings->values()}, {"not_applied", not_applied}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

int run_pack(const PackArgs& a) {
  data::DataSettings settings("pack", "--set");
  for (const auto& o : a.overrides) settings.set(o);
  // A local source opens as a training split, so that data.images_root is where a COCO file's
  // images are; a remote one as an evaluation split, read in order without a training window ahead.
  auto source = data::open_data_path(a.src, settings.data(), /*train=*/!data::is_remote_path(a.src));
  if (a.lmdb) {
    data::write_lmdb(*source, a.dst);
    log_info("{} → {} (LMDB): {} samples", a.src, a.dst, source->size());
    return 0;
  }
  data::PackOptions o;
  o.mode = a.reencode ? data::PackOptions::Mode::kReencode
                      : a.raw ? data::PackOptions::Mode::kRaw : data::PackOptions::Mode::kOriginal;
  o.max_side = a.max_side;
  o.quality = a.quality;
  o.validate = a.validate;
  o.shard_bytes = std::max<int64_t>(1, static_cast<int64_t>(a.shard_mb * double(int64_t{1} << 20)));
  o.align = a.align;
  o.threads = a.threads > 0 ? a.threads : available_cores();
  const auto t0 = std::chrono::steady_clock::now();
  data::PackReport r = data::pack_samples(*source, a.dst, o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& b : r.bad) log_warn("left out: {}", b);
  log_info("{} → {}: {} samples, {} bytes in {} file(s), {:.1f} s{}", a.src, a.dst, r.samples, r.bytes, r.files.size(),
           secs, r.bad.empty() ? "" : fmt::format("; {} bad sample(s) left out", r.bad.size()));
  return 0;
}

}  // namespace crucible::cli
