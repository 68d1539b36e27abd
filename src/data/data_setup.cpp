// make_data / make_pipeline_for_path: config → pipelines.
#include "crucible/data/data_setup.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/eval/coco_eval.h"
#include "crucible/data/formats/array_source.h"
#include "crucible/data/formats/sample_source.h"
#include "crucible/data/formats/source.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/samplers/global_sampler.h"
#include "crucible/data/loader/detection_pipeline.h"
#include "crucible/data/remote/remote_source.h"
#include "crucible/data/transforms/detection_presets.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const data::SamplePipeline> image_pipeline(std::shared_ptr<const data::SampleSource> source,
                                                           const DataConfig& c, uint64_t seed, bool train) {
  data::ImagePipelineOptions o;
  o.crop = static_cast<int>(train || c.eval_crop == 0 ? c.crop : c.eval_crop);
  if (!train) o.resize = static_cast<int>(c.eval_resize);
  o.train = train;
  if (train) o.transforms = training_transforms(c, data::ImageSpec{o.crop, o.crop, 3});
  o.cache = c.cache;
  o.cache_bytes = c.cache_mb << 20;
  o.order = data::parse_color_order(c.color_order, "data.color_order");
  o.fast_decode = c.jpeg_decode == "fast";
  o.dct_scaling = c.jpeg_dct_scaling;
  o.exif_orientation = c.exif_orientation;
  o.augment_seed = seed;
  return std::make_shared<data::ImagePipeline>(std::move(source), o);
}

// data.train_samples / data.test_samples (`key` = `n`) for a sample source: 0 keeps every
// sample, otherwise n of them spread evenly (the source is ordered by class, so its first n
// would hold only the first classes); more than the source holds is a wrong config.
std::shared_ptr<const data::SampleSource> take_samples(std::shared_ptr<const data::SampleSource> source, int64_t n,
                                                       const char* key, const std::string& path) {
  if (n == 0) return source;
  if (n > source->size()) {
    throw bad_input("{} = {} but {} holds {} samples: ask for at most {}, or 0 for all", key, n, path, source->size(),
                    source->size());
  }
  return data::subset_evenly(std::move(source), n);
}

// IDX pair inside `dir`: the gzip or plain files of the given split ("train" or "t10k").
bool find_idx(const std::string& dir, const std::string& split, std::string* images, std::string* labels) {
  for (const char* ext : {".gz", ""}) {
    const fs::path img = fs::path(dir) / (split + "-images-idx3-ubyte" + ext);
    const fs::path lab = fs::path(dir) / (split + "-labels-idx1-ubyte" + ext);
    if (fs::exists(img) && fs::exists(lab)) {
      *images = img.string();
      *labels = lab.string();
      return true;
    }
  }
  return false;
}

// data.dataset = "arrays": the IDX keys name array files; the features stay memory-mapped (D13).
DataSetup make_array_data(const DataConfig& c, uint64_t augment_seed) {
  std::shared_ptr<const data::ArraySource> train =
      data::load_array_source(c.train_images, c.train_labels, c.train_samples, "data.train_samples");
  std::shared_ptr<const data::ArraySource> test =
      data::load_array_source(c.test_images, c.test_labels, c.test_samples, "data.test_samples");
  const std::vector<int64_t> a(train->stored_shape().begin() + 1, train->stored_shape().end());
  const std::vector<int64_t> b(test->stored_shape().begin() + 1, test->stored_shape().end());
  if (a != b || train->stored_dtype() != test->stored_dtype()) {
    throw bad_input("data.train_images = {} holds {} samples of shape [{}] but data.test_images = {} holds {} samples "
                    "of shape [{}]: training and test samples must have the same dtype and shape",
                    train->features_where(), io::dtype_name(train->stored_dtype()), fmt::join(a, ", "),
                    test->features_where(), io::dtype_name(test->stored_dtype()), fmt::join(b, ", "));
  }
  const data::ImageSpec spec = train->spec();
  // D4: say what the values are and how they reach the model.
  const data::ArraySource::ValueReport report = train->value_report(1000);
  log_info("data (D4): {}{}", report.info,
           spec.type == data::SampleType::kPixels
               ? fmt::format(" (data.mean = [{}], data.std = [{}], {} units)", fmt::join(c.mean, ", "),
                             fmt::join(c.std, ", "), c.mean_std_range)
               : "");
  if (!report.warning.empty()) log_warn("data (D4): {}", report.warning);
  for (const auto* s : {train.get(), test.get()}) {
    if (!s->features_mapped()) log_warn("data (D13): {}: {}", s->features_where(), s->features_note());
  }
  if (train->target_width() != test->target_width()) {
    auto what = [](const data::ArraySource& s) {
      return s.target_width() > 0 ? fmt::format("multi-label targets over {} classes", s.target_width())
                                  : std::string("one class index per sample");
    };
    throw bad_input("data.train_labels = {} holds {} but data.test_labels = {} holds {}: both must be class indices, "
                    "or targets over the same classes",
                    c.train_labels, what(*train), c.test_labels, what(*test));
  }
  DataSetup d;
  d.num_classes = std::max(train->num_classes(), test->num_classes());
  d.train = std::make_shared<data::ArrayPipeline>(train, training_transforms(c, spec), augment_seed);
  d.test = std::make_shared<data::ArrayPipeline>(test, data::SampleTransforms{}, 0);
  return d;
}

// data.dataset = "idx": an IDX pair per split, held in RAM.
DataSetup make_idx_data(const DataConfig& c, uint64_t augment_seed) {
  std::shared_ptr<const data::Source> train =
      data::load_idx_source(c.train_images, c.train_labels, c.train_samples, "data.train_samples");
  std::shared_ptr<const data::Source> test =
      data::load_idx_source(c.test_images, c.test_labels, c.test_samples, "data.test_samples");
  const data::ImageSpec a = train->spec(), b = test->spec();
  if (a.height != b.height || a.width != b.width || a.channels != b.channels) {
    throw bad_input("training images are {} but test images are {}", a.to_string(), b.to_string());
  }
  DataSetup d;
  d.num_classes = std::max(train->num_classes(), test->num_classes());
  d.train = std::make_shared<data::ArrayPipeline>(train, training_transforms(c, a), augment_seed);
  d.test = std::make_shared<data::ArrayPipeline>(test, data::SampleTransforms{}, 0);
  return d;
}

// data.dataset = "images" classifies: a set with boxes is a detection set.
void refuse_boxes(const data::SampleSource& s, const std::string& path) {
  if (s.has_boxes()) {
    throw bad_input("{} is a detection set (images with boxes) but data.dataset = \"images\" classifies; set "
                    "data.dataset = \"detection\"",
                    path);
  }
}

// data.dataset = "images": encoded samples from a path (sample_source.h: open_samples) or URL.
DataSetup make_image_data(const DataConfig& c, uint64_t augment_seed) {
  if (c.train_path.empty() || c.test_path.empty()) {
    throw bad_input("data.dataset = \"images\" needs data.train_path and data.test_path");
  }
  std::shared_ptr<const data::SampleSource> train = open_data_path(c.train_path, c, true);
  std::shared_ptr<const data::SampleSource> test = open_data_path(c.test_path, c, false);
  if (train->size() == 0) throw bad_input("{}: no samples", c.train_path);
  refuse_boxes(*train, c.train_path);
  refuse_boxes(*test, c.test_path);
  train = take_samples(std::move(train), c.train_samples, "data.train_samples", c.train_path);
  test = take_samples(std::move(test), c.test_samples, "data.test_samples", c.test_path);
  DataSetup d;
  d.num_classes = static_cast<int64_t>(std::max(train->classes().size(), test->classes().size()));
  d.train = image_pipeline(train, c, augment_seed, true);
  d.test = image_pipeline(test, c, 0, false);
  return d;
}

// eval and predict: the test split alone, through the pipeline training evaluates with.
DataSetup make_idx_test(const DataConfig& c) {
  DataSetup d;
  std::shared_ptr<const data::Source> test =
      data::load_idx_source(c.test_images, c.test_labels, c.test_samples, "data.test_samples");
  d.num_classes = test->num_classes();
  d.test = std::make_shared<data::ArrayPipeline>(test, data::SampleTransforms{}, 0);
  d.train = d.test;
  return d;
}

DataSetup make_array_test(const DataConfig& c) {
  DataSetup d;
  std::shared_ptr<const data::ArraySource> test =
      data::load_array_source(c.test_images, c.test_labels, c.test_samples, "data.test_samples");
  if (!test->features_mapped()) log_warn("data (D13): {}: {}", test->features_where(), test->features_note());
  d.num_classes = test->num_classes();
  d.test = std::make_shared<data::ArrayPipeline>(test, data::SampleTransforms{}, 0);
  d.train = d.test;
  return d;
}

DataSetup make_image_test(const DataConfig& c) {
  if (c.test_path.empty()) throw bad_input("data.dataset = \"images\" needs data.test_path (the samples to evaluate)");
  std::shared_ptr<const data::SampleSource> test =
      take_samples(open_data_path(c.test_path, c, false), c.test_samples, "data.test_samples", c.test_path);
  refuse_boxes(*test, c.test_path);
  DataSetup d;
  d.num_classes = static_cast<int64_t>(test->classes().size());
  d.test = image_pipeline(test, c, 0, false);
  d.train = d.test;
  return d;
}

// data.dataset = "detection": a COCO file or a YOLO folder per split, through the preset's transforms.
std::shared_ptr<const data::SamplePipeline> detection_pipeline(std::shared_ptr<const data::SampleSource> source,
                                                               const DataConfig& c, uint64_t seed, bool train) {
  if (!source->has_boxes()) {
    throw bad_input("data.dataset = \"detection\": {} holds no boxes; expected a COCO instances .json or a YOLO images "
                    "folder (…/images/<split> beside …/labels/<split>)",
                    source->describe());
  }
  const auto& d = c.pieces.get<DetectionSettings>(kDetectionPiece);
  const auto& preset = detection_preset_registry().get(d.preset, "data.detection_preset").factory;
  DetectionPipelineOptions o;
  o.preset = d.preset;
  if (train) o.transforms = preset.train(c);
  if (!train && preset.eval) o.transforms = preset.eval(c);
  if (preset.layout) {
    const DetectionBatchLayout l = preset.layout(c);
    o.size_divisible = l.size_divisible;
    o.fixed_width = l.fixed_width;
    o.fixed_height = l.fixed_height;
    o.pad_value = l.pad_value;
  } else {
    o.size_divisible = static_cast<int>(d.size_divisible);
  }
  o.order = data::parse_color_order(c.color_order, "data.color_order");
  o.fast_decode = c.jpeg_decode == "fast";
  o.exif_orientation = c.exif_orientation;
  o.augment_seed = seed;
  return std::make_shared<DetectionPipeline>(std::move(source), std::move(o));
}

std::shared_ptr<const data::SampleSource> open_detection_split(const DataConfig& c, bool train) {
  const std::string& path = train ? c.train_path : c.test_path;
  const char* key = train ? "data.train_path" : "data.test_path";
  if (path.empty()) throw bad_input("data.dataset = \"detection\" needs {} (a COCO instances .json or a YOLO images folder)", key);
  std::shared_ptr<const data::SampleSource> s = open_data_path(path, c, train);  // remote: a packed detection set
  return take_samples(std::move(s), train ? c.train_samples : c.test_samples,
                      train ? "data.train_samples" : "data.test_samples", path);
}

// The test split's ground truth (DataSetup::test_truth).
std::shared_ptr<const CocoGroundTruth> detection_truth(const DataConfig& c, const data::SampleSource& test) {
  const std::string& path = c.test_path;
  std::error_code ec;
  const bool json = path.size() > 5 && (path.compare(path.size() - 5, 5, ".json") == 0 ||
                                         path.compare(path.size() - 5, 5, ".JSON") == 0);
  if (!data::is_remote_path(path) && json && std::filesystem::is_regular_file(path, ec)) {
    return std::make_shared<const CocoGroundTruth>(read_coco_ground_truth(path));
  }
  auto truth = std::make_shared<CocoGroundTruth>();
  const std::vector<int64_t> ids = test.category_ids();
  const auto category = [&](int64_t label) { return ids.empty() ? label : ids[static_cast<size_t>(label)]; };
  for (size_t k = 0; k < test.classes().size(); ++k) truth->category_ids.push_back(category(static_cast<int64_t>(k)));
  std::sort(truth->category_ids.begin(), truth->category_ids.end());
  int64_t next_id = 1;
  for (int64_t i = 0; i < test.size(); ++i) {
    const EncodedSample s = test.get(i);
    const int64_t image = s.image_id >= 0 ? s.image_id : i;
    truth->image_ids.push_back(image);
    if (!s.boxes) continue;
    for (size_t k = 0; k < s.boxes->size(); ++k) {
      CocoGroundTruth::Box b;
      b.id = next_id++;
      b.image_id = image;
      b.category_id = category(s.boxes->labels[k]);
      const float* xyxy = s.boxes->xyxy.data() + 4 * k;
      b.bbox[0] = xyxy[0];
      b.bbox[1] = xyxy[1];
      b.bbox[2] = static_cast<double>(xyxy[2]) - xyxy[0];
      b.bbox[3] = static_cast<double>(xyxy[3]) - xyxy[1];
      b.area = b.bbox[2] * b.bbox[3];
      b.iscrowd = !s.boxes->iscrowd.empty() && s.boxes->iscrowd[k] != 0;
      truth->boxes.push_back(b);
    }
  }
  std::sort(truth->image_ids.begin(), truth->image_ids.end());
  return truth;
}

DataSetup make_detection_data(const DataConfig& c, uint64_t augment_seed) {
  std::shared_ptr<const data::SampleSource> train = open_detection_split(c, true);
  std::shared_ptr<const data::SampleSource> test = open_detection_split(c, false);
  if (train->classes() != test->classes()) {
    throw bad_input("{} names the classes [{}] but {} names [{}]: both splits must have the same categories",
                    c.train_path, fmt::join(train->classes(), ", "), c.test_path, fmt::join(test->classes(), ", "));
  }
  DataSetup d;
  d.num_classes = static_cast<int64_t>(train->classes().size());
  d.train = detection_pipeline(train, c, augment_seed, true);
  d.test = detection_pipeline(test, c, 0, false);
  d.test_truth = detection_truth(c, *test);
  return d;
}

DataSetup make_detection_test(const DataConfig& c) {
  std::shared_ptr<const data::SampleSource> test = open_detection_split(c, false);
  DataSetup d;
  d.num_classes = static_cast<int64_t>(test->classes().size());
  d.test = detection_pipeline(test, c, 0, false);
  d.train = d.test;
  d.test_truth = detection_truth(c, *test);
  return d;
}

// A value of data.dataset: its training and test pipelines, and its test split alone (eval and
// predict). A new kind is its two functions and an entry here.
struct DatasetKind {
  DataConfig::Dataset kind;
  DataSetup (*make)(const DataConfig& c, uint64_t augment_seed);
  DataSetup (*make_test)(const DataConfig& c);
};

const DatasetKind& dataset_kind(DataConfig::Dataset kind) {
  static const DatasetKind kinds[] = {
      {DataConfig::Dataset::kIdx, make_idx_data, make_idx_test},
      {DataConfig::Dataset::kArrays, make_array_data, make_array_test},
      {DataConfig::Dataset::kImages, make_image_data, make_image_test},
      {DataConfig::Dataset::kDetection, make_detection_data, make_detection_test},
  };
  for (const DatasetKind& k : kinds) {
    if (k.kind == kind) return k;
  }
  throw std::logic_error("data.dataset: a kind without its entry in data_setup.cpp's dataset_kind()");
}

}  // namespace

RemoteSourceOptions remote_source_options(const DataConfig& c, bool train) {
  RemoteSourceOptions o;
  o.remote.s3_endpoint = c.s3_endpoint;
  o.remote.s3_region = c.s3_region;
  o.remote.ca_bundle = c.ca_bundle;
  o.remote.tries = static_cast<int>(c.remote_tries);
  o.remote.timeout_s = c.remote_timeout;
  o.remote.connections = static_cast<int>(c.io_threads);
  o.remote.part_bytes = c.remote_part_bytes;
  o.remote.env = [](const char* name) -> const char* { return std::getenv(name); };
  o.cache_dir = c.cache_dir;
  if (o.cache_dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    o.cache_dir = (xdg != nullptr && *xdg != 0) ? std::string(xdg) : std::string(home != nullptr ? home : "/tmp") + "/.cache";
    o.cache_dir += "/crucible/shards";
  }
  o.cache_bytes = c.cache_bytes;
  o.io_threads = static_cast<int>(c.io_threads);
  o.boxes = detection_source_options(c, train).boxes;  // a packed detection set's targets
  // The global order reads a window of shards at a time, all of them until its end: keep it
  // pinned and fetch the whole next window meanwhile (at least the I/O threads' worth), or the
  // next window's first batch waits for its shards. It works with one shard beyond the window.
  const bool global = resolved_sampler(c.sampler, /*remote=*/true) == "global";
  const int64_t window = c.pieces.get<GlobalOrderOptions>("global").shuffle_window;
  if (train && global && window > 0) {
    o.ahead_shards = static_cast<int>(window + std::max<int64_t>(window, c.io_threads));
    o.least_ahead_shards = static_cast<int>(window + 1);
    o.ahead_why = fmt::format("data.shuffle_window = {}: the window being read and the next", window);
  } else {
    o.ahead_shards = static_cast<int>(c.io_threads + 1);
    o.ahead_why = "data.io_threads + 1";
  }
  return o;
}

std::unique_ptr<SampleSource> open_data_path(const std::string& path, const DataConfig& c, bool train) {
  if (is_remote_path(path)) return open_remote_samples(path, remote_source_options(c, train));
  return open_samples(path, detection_source_options(c, train));
}

DataSetup make_data(const DataConfig& c, uint64_t augment_seed, bool test_only) {
  const DatasetKind& kind = dataset_kind(c.dataset);
  return test_only ? kind.make_test(c) : kind.make(c, augment_seed);
}

std::shared_ptr<const data::SamplePipeline> make_pipeline_for_path(const std::string& path, const DataConfig& c,
                                                                   uint64_t augment_seed, bool train) {
  // The training split honours data.train_samples, the evaluation split data.test_samples.
  const int64_t n = train ? c.train_samples : c.test_samples;
  const char* key = train ? "data.train_samples" : "data.test_samples";
  std::string images, labels;
  if (c.dataset != DataConfig::Dataset::kDetection && fs::is_directory(path) &&
      find_idx(path, train ? "train" : "t10k", &images, &labels)) {
    std::shared_ptr<const data::Source> src = data::load_idx_source(images, labels, n, key);
    return std::make_shared<data::ArrayPipeline>(
        src, train ? training_transforms(c, src->spec()) : data::SampleTransforms{}, augment_seed);
  }
  // A source with boxes (COCO, YOLO) is a detection set whatever data.dataset says.
  std::shared_ptr<const data::SampleSource> s = take_samples(open_data_path(path, c, train), n, key, path);
  if (s->has_boxes() || c.dataset == DataConfig::Dataset::kDetection) {
    return detection_pipeline(std::move(s), c, augment_seed, train);
  }
  return image_pipeline(std::move(s), c, augment_seed, train);
}

data::LoaderOptions loader_options(const DataConfig& c, int64_t batch_size, int threads) {
  data::LoaderOptions o;
  o.batch_size = batch_size;
  o.threads = threads;
  o.prefetch = static_cast<int>(c.prefetch);
  o.bad_samples = c.bad_samples;
  return o;
}

}  // namespace crucible::data
