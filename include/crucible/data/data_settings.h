// The [data] section as the data commands read it (`crucible bench loader`, the Python loaders):
// every key a job's [data] holds (bind_data_config: the section's own, the data pieces', and the
// device's batch transforms', batch_settings.h) and run.seed, under the rule every command follows
// (README, "Training"): a key given with --set wins over the command's own defaults, an option
// given explicitly that a --set contradicts is bad input naming both, and an option not given
// leaves the key's value. What a loader run cannot apply of the keys given, not_applied() names,
// with why. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "crucible/data/data_config.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::data {

class DataSettings {
 public:
  // `command` names the reader in messages ("bench loader", "ImageLoader"); `set_name` is how
  // its overrides are given ("--set", "settings").
  DataSettings(std::string command, std::string set_name);
  ~DataSettings();
  DataSettings(const DataSettings&) = delete;
  DataSettings& operator=(const DataSettings&) = delete;

  // The order of the three: the command's defaults, then the overrides, then its options.
  // A default of the command's own ("data.hflip=0": ArrayLoader flips nothing unless asked).
  void command_default(const std::string& assignment);
  // One override, "data.key=value" or "run.seed=N"; a key of another section is bad input
  // saying what the command reads.
  void set(const std::string& assignment);
  // An option the user gave explicitly, as written (`given`: "--crop 96", "crop=96"), setting
  // `assignment` ("data.crop=96"): bad input naming both when an override gave the key another
  // value.
  void option(const std::string& given, const std::string& assignment);
  // The command names its data itself (`given`: "--data photos/"), as these keys with these
  // values would: any other key that names the data (data.dataset, the IDX/array file keys,
  // data.train_path, data.test_path) given, or one of these given another value, is bad input
  // naming both.
  void source(const std::string& given, const std::vector<std::pair<std::string, std::string>>& same_as);

  bool given(const std::string& key) const;  // by an override or an option
  const DataConfig& data() const;
  int64_t seed() const;  // run.seed
  // Every [data] key and run.seed with its value now (numbers, booleans, strings, lists), in the
  // schema's order.
  nlohmann::ordered_json values() const;
  // Every [data] key, in the schema's order.
  std::vector<std::string> data_keys() const;

 private:
  std::string key_of(const std::string& assignment) const;

  std::string command_, set_name_;
  DataConfig data_;
  int64_t seed_ = 0;
  std::unique_ptr<ConfigSchema> schema_;  // bound to data_ and seed_
  std::map<std::string, std::string> sets_;  // key → the override that gave it (the last)
  std::set<std::string> options_;            // keys an option gave
};

// How a loader run reads its data, for not_applied().
struct LoaderUse {
  bool train = true;       // the training split's keys (data.train_samples); false: evaluation's
  bool transforms = true;  // the training sample transforms run (data.hflip, data.augment, …)
  bool order = true;       // the training order (data.sampler and its pieces' keys); false: in order
  bool images = true;      // encoded images; false: IDX or array samples, in memory
  bool remote = false;     // shards behind s3:// or http(s):// URLs
  bool detection = false;  // images with boxes through a detection preset (data.dataset = "detection")
  std::string eval_switch;    // how evaluation is asked for ("--eval", "train=False"; "" when it cannot be)
  std::string normalisation;  // why data.mean/std do not apply here (the loader delivers uint8 pixels)
};

// The keys given (by an override or an option) that a loader run as `use` does not apply, each
// with why, in the schema's order.
std::vector<std::pair<std::string, std::string>> not_applied(const DataSettings& settings, const LoaderUse& use);

}  // namespace crucible::data
