// DataSettings and not_applied: the [data] keys as the data commands read them (data_settings.h).
#include "crucible/data/data_settings.h"

#include <algorithm>
#include <filesystem>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/data/transforms/batch_settings.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/transforms/detection_presets.h"

namespace crucible::data {
namespace {

// The keys that name the data to read.
const std::set<std::string> kSourceKeys = {"data.dataset",     "data.train_images", "data.train_labels",
                                           "data.test_images", "data.test_labels",  "data.train_path",
                                           "data.test_path"};
// The training split's and evaluation's own keys.
const std::set<std::string> kTrainSplitKeys = {"data.train_samples", "data.train_path", "data.train_images",
                                               "data.train_labels"};
const std::set<std::string> kEvalKeys = {"data.test_samples", "data.test_path",  "data.test_images",
                                         "data.test_labels",  "data.eval_crop",  "data.eval_resize"};
// The image pipeline's (encoded images: decoding, cropping, caching).
const std::set<std::string> kImageKeys = {"data.crop",  "data.eval_crop",   "data.eval_resize",
                                          "data.cache", "data.cache_mb",    "data.jpeg_decode",
                                          "data.jpeg_dct_scaling", "data.exif_orientation", "data.color_order"};
// The classification image pipeline's own, which a detection pipeline does not run (it decodes the
// whole image and runs data.detection_preset's transforms).
const std::set<std::string> kClassificationImageKeys = {"data.crop", "data.eval_crop", "data.eval_resize", "data.cache",
                                                        "data.cache_mb", "data.jpeg_dct_scaling"};
// Normalisation: DeviceInput's, after the loader.
const std::set<std::string> kNormalisationKeys = {"data.mean", "data.std", "data.mean_std_range",
                                                  "data.mean_std_order"};
// Remote shards' (remote_source.h).
const std::set<std::string> kRemoteKeys = {"data.cache_dir",    "data.cache_bytes",    "data.s3_endpoint",
                                           "data.s3_region",    "data.ca_bundle",      "data.remote_tries",
                                           "data.remote_timeout", "data.io_threads",   "data.remote_part_bytes"};

std::set<std::string> names(const ConfigSchema& s) {
  std::set<std::string> out;
  for (const ConfigKey* k : s.keys()) out.insert(k->full_name());
  return out;
}

// The keys the registered pieces of `registry` declare (sample transforms, samplers).
template <typename Registry>
std::set<std::string> piece_keys(const Registry& registry) {
  DataConfig c;
  ConfigSchema s;
  for (const auto& e : registry.entries()) {
    if (e.factory.declare) e.factory.declare(c, s);
  }
  return names(s);
}

// The detection keys (detection_presets.h).
std::set<std::string> detection_keys() {
  DetectionSettings d;
  ConfigSchema s;
  declare_settings(s, d);
  return names(s);
}

// The keys of the batch transforms training runs on the device.
std::set<std::string> device_keys() {
  DataConfig c;
  ConfigSchema s;
  declare_batch_transform_settings(c, s);
  return names(s);
}

nlohmann::ordered_json value_of(const ConfigKey& k) {
  const std::string toml = k.current_toml();
  try {
    return nlohmann::ordered_json::parse(toml);
  } catch (const nlohmann::json::parse_error&) {
    return toml;  // a TOML number JSON lacks (nan, inf)
  }
}

std::string normal_path(const std::string& p) {
  std::string s = std::filesystem::path(p).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

DataSettings::DataSettings(std::string command, std::string set_name)
    : command_(std::move(command)), set_name_(std::move(set_name)), schema_(std::make_unique<ConfigSchema>()) {
  bind_data_config(data_, *schema_);
  schema_->add("run", "seed", &seed_, "the seed the augmentation and sampler streams derive from").non_negative();
}

DataSettings::~DataSettings() = default;

std::string DataSettings::key_of(const std::string& assignment) const {
  const auto eq = assignment.find('=');
  return eq == std::string::npos ? assignment : assignment.substr(0, eq);
}

void DataSettings::command_default(const std::string& assignment) { schema_->apply_override(assignment); }

void DataSettings::set(const std::string& assignment) {
  const std::string key = key_of(assignment);
  const auto dot = key.find('.');
  if (dot != std::string::npos && key.substr(0, dot) != "data" && key != "run.seed") {
    throw bad_input("{}: {} {}: {} reads the [data] keys and run.seed only", command_, set_name_, assignment,
                    command_);
  }
  schema_->apply_override(assignment);  // an unknown [data] key or a bad value: named, with what is allowed
  sets_[key] = assignment;
}

void DataSettings::option(const std::string& given, const std::string& assignment) {
  const std::string key = key_of(assignment);
  const auto dot = key.find('.');
  const ConfigKey* k = dot == std::string::npos ? nullptr : schema_->find(key.substr(0, dot), key.substr(dot + 1));
  if (k == nullptr) throw std::logic_error("DataSettings::option: no key " + key);
  const std::string before = k->current_toml();
  schema_->apply_override(assignment);
  const auto set = sets_.find(key);
  if (set != sets_.end() && k->current_toml() != before) {
    throw bad_input("{}: {} and {} {} disagree: give one of them, or the same value", command_, given, set_name_,
                    set->second);
  }
  options_.insert(key);
}

void DataSettings::source(const std::string& given, const std::vector<std::pair<std::string, std::string>>& same_as) {
  const nlohmann::ordered_json now = values();
  for (const auto& [key, assignment] : sets_) {
    if (kSourceKeys.count(key) == 0) continue;
    const std::string& name = key;  // C++17: a lambda cannot capture a structured binding
    const auto same = std::find_if(same_as.begin(), same_as.end(), [&](const auto& p) { return p.first == name; });
    if (same != same_as.end() && now[key].is_string() &&
        normal_path(now[key].get<std::string>()) == normal_path(same->second)) {
      continue;
    }
    throw bad_input("{}: {} names the data it reads, and {} {} names them too: give one of them", command_, given,
                    set_name_, assignment);
  }
}

bool DataSettings::given(const std::string& key) const { return sets_.count(key) != 0 || options_.count(key) != 0; }

const DataConfig& DataSettings::data() const { return data_; }

int64_t DataSettings::seed() const { return seed_; }

nlohmann::ordered_json DataSettings::values() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const ConfigKey* k : schema_->keys()) {
    if (k->section() == "data" || k->full_name() == "run.seed") out[k->full_name()] = value_of(*k);
  }
  return out;
}

std::vector<std::string> DataSettings::data_keys() const {
  std::vector<std::string> out;
  for (const ConfigKey* k : schema_->keys()) {
    if (k->section() == "data") out.push_back(k->full_name());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> not_applied(const DataSettings& settings, const LoaderUse& use) {
  static const std::set<std::string> device = device_keys();
  static const std::set<std::string> detection = detection_keys();
  static const std::set<std::string> transforms = piece_keys(sample_transform_registry());
  static const std::set<std::string> order = [] {
    std::set<std::string> keys = piece_keys(sampler_registry());
    keys.insert("data.sampler");
    return keys;
  }();
  const std::string eval_why = use.eval_switch.empty() ? "evaluation's, and this loader has no evaluation mode"
                                                       : "evaluation's: it applies with " + use.eval_switch;
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& key : settings.data_keys()) {
    if (!settings.given(key)) continue;
    std::string why;
    if (device.count(key) != 0) {
      why = "a batch transform that training runs on the device, on whole batches after the loader (crucible preview "
            "shows it)";
    } else if (kNormalisationKeys.count(key) != 0) {
      why = use.normalisation;
    } else if (!use.images && kImageKeys.count(key) != 0) {
      why = "encoded images' own, and these samples are IDX or array pixels, in memory";
    } else if (!use.detection && detection.count(key) != 0) {
      why = "detection data's (data.dataset = \"detection\"), and these samples are classification's";
    } else if (use.detection && kClassificationImageKeys.count(key) != 0) {
      why = "the classification image pipeline's; a detection pipeline decodes the whole image and runs "
            "data.detection_preset's transforms";
    } else if (use.detection && transforms.count(key) != 0 && key != "data.hflip") {
      why = "a classification sample transform; a detection pipeline runs data.detection_preset's transforms";
    } else if (!use.remote && kRemoteKeys.count(key) != 0) {
      why = "remote data's (s3://, http(s)://), and these data are local";
    } else if (!use.train && kTrainSplitKeys.count(key) != 0) {
      why = "the training split's: evaluation reads the test split's keys";
    } else if (use.train && kEvalKeys.count(key) != 0) {
      why = eval_why;
    } else if (!use.transforms && transforms.count(key) != 0) {
      why = "a training sample transform, and evaluation runs none";
    } else if (!use.order && order.count(key) != 0) {
      why = "the training order's, and this run reads the samples in order";
    }
    if (!why.empty()) out.emplace_back(key, why);
  }
  return out;
}

}  // namespace crucible::data
