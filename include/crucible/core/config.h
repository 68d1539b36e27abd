// Typed, validated configuration: a schema of `section.key` entries, each bound to a field
// of an options struct (whose initial value is the default), loaded from TOML and from
// `--set section.key=value` overrides. Every key is checked: an unknown key, a wrong type or
// an out-of-range value is a bad-input Error naming the key and what is allowed (law 6).
// Torch-free. Not thread-safe: build, load and read from one thread.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace crucible {

class Error;

// A value as read from TOML or the command line, before it is checked against a key.
using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<double>, std::vector<std::string>>;

enum class ConfigType { kBool, kInt, kFloat, kString, kFloatList, kStringList };

// One `section.key` bound to a field. Constraints are added fluently after ConfigSchema::add.
class ConfigKey {
 public:
  // Numeric range; exclusive bounds make "> 0" expressible. Applies to each list element.
  ConfigKey& min(double lo, bool exclusive = false);
  ConfigKey& max(double hi, bool exclusive = false);
  ConfigKey& positive() { return min(0.0, /*exclusive=*/true); }
  ConfigKey& non_negative() { return min(0.0); }
  // Allowed strings.
  ConfigKey& choices(std::vector<std::string> allowed);
  // The keyword the library this key mirrors gives the option (torchvision's `num_ops` for
  // data.augment_num_ops): the Python loaders accept it in a piece's options dict.
  ConfigKey& arg(std::string name) {
    arg_ = std::move(name);
    return *this;
  }
  const std::string& arg() const { return arg_; }

  const std::string& section() const { return section_; }
  const std::string& key() const { return key_; }
  std::string full_name() const { return section_ + "." + key_; }
  const std::string& help() const { return help_; }
  ConfigType type() const { return type_; }
  // "integer ≥ 0", "one of: adamw, sgd", … for messages and --help.
  std::string allowed_text() const;
  // The field's current value as a TOML literal.
  std::string current_toml() const;
  const std::string& default_toml() const { return default_toml_; }

  // Checks `value` against type and constraints, then assigns it. `origin` names where it came
  // from ("configs/x.toml", "--set") for the message. Throws bad_input.
  void assign(const ConfigValue& value, const std::string& origin);

 private:
  friend class ConfigSchema;
  ConfigKey(std::string section, std::string key, std::string help, ConfigType type,
            std::function<void(const ConfigValue&)> set, std::function<ConfigValue()> get);

  std::string section_, key_, help_;
  ConfigType type_;
  std::function<void(const ConfigValue&)> set_;
  std::function<ConfigValue()> get_;
  std::string default_toml_;
  std::string arg_;
  bool has_min_ = false, has_max_ = false, min_exclusive_ = false, max_exclusive_ = false;
  double min_ = 0, max_ = 0;
  std::vector<std::string> choices_;
};

class ConfigSchema {
 public:
  ConfigSchema() = default;
  ConfigSchema(const ConfigSchema&) = delete;
  ConfigSchema& operator=(const ConfigSchema&) = delete;

  // Binds `section.key` to *field; the field must outlive the schema. Its current value is the
  // default shown in --help.
  ConfigKey& add(const std::string& section, const std::string& key, bool* field, std::string help);
  ConfigKey& add(const std::string& section, const std::string& key, int64_t* field, std::string help);
  ConfigKey& add(const std::string& section, const std::string& key, double* field, std::string help);
  ConfigKey& add(const std::string& section, const std::string& key, std::string* field, std::string help);
  ConfigKey& add(const std::string& section, const std::string& key, std::vector<double>* field,
                 std::string help);
  // A list of strings; `--set k=word` (bare text) is a list of that one word.
  ConfigKey& add(const std::string& section, const std::string& key, std::vector<std::string>* field,
                 std::string help);
  // A string key held as an enum from parsing onwards: `names` lists every allowed spelling
  // with its value, in the order --help shows them (they become the key's choices).
  template <typename E>
  ConfigKey& add_enum(const std::string& section, const std::string& key, E* field,
                      std::vector<std::pair<std::string, E>> names, std::string help) {
    std::vector<std::string> allowed;
    for (const auto& n : names) allowed.push_back(n.first);
    auto set = [field, names](const ConfigValue& v) {
      for (const auto& n : names) {
        if (n.first == std::get<std::string>(v)) *field = n.second;
      }
    };
    auto get = [field, names]() -> ConfigValue {
      for (const auto& n : names) {
        if (n.second == *field) return n.first;
      }
      return std::string("?");
    };
    return add_custom(section, key, std::move(help), ConfigType::kString, std::move(set), std::move(get))
        .choices(std::move(allowed));
  }

  // Loads a TOML document; every table must be a known section and every key a known key.
  void load_file(const std::string& path);
  void load_string(const std::string& toml_text, const std::string& origin);
  // Applies one "section.key=value" override. The value is read as TOML ("0.1", "true",
  // "[0.5, 0.5]", "\"x\"") and, for string keys, bare text is taken as it is.
  void apply_override(const std::string& assignment);

  // The whole configuration as TOML, sections and keys in registration order.
  std::string to_toml() const;
  // The key reference for --help: every key with its default, what is allowed and its help.
  std::string help_text() const;
  // (full name, current value as TOML) for every key, in registration order.
  std::vector<std::pair<std::string, std::string>> values() const;

  const ConfigKey* find(const std::string& section, const std::string& key) const;
  // Every key, in registration order.
  std::vector<const ConfigKey*> keys() const;

 private:
  ConfigKey& add_key(std::unique_ptr<ConfigKey> key);
  ConfigKey& add_custom(const std::string& section, const std::string& key, std::string help, ConfigType type,
                        std::function<void(const ConfigValue&)> set, std::function<ConfigValue()> get);
  template <typename T>
  ConfigKey& bind(const std::string& section, const std::string& key, T* field, std::string help, ConfigType type);
  ConfigKey* find_mutable(const std::string& section, const std::string& key);
  std::vector<std::string> sections() const;
  // The error for an unknown section or key, with a suggestion and the allowed names.
  Error unknown_key(const std::string& where, const std::string& section, const std::string& key) const;

  std::vector<std::unique_ptr<ConfigKey>> keys_;
};

// The settings of the pieces a job's config collects without naming them (a sample transform's,
// declared in the piece's own file): each an options struct of the piece's, by the piece's name,
// holding its defaults until a config sets them. Copies are deep (each JobConfig its own).
class PieceOptions {
 public:
  // `piece`'s options, made with their defaults on first use (runtime_error for another type).
  template <typename T>
  T& of(const std::string& piece) {
    std::any& slot = options_[piece];
    if (!slot.has_value()) slot = T{};
    return cast<T>(slot, piece);
  }
  // `piece`'s options as declared, or their defaults when nothing declared them.
  template <typename T>
  T get(const std::string& piece) const {
    const auto it = options_.find(piece);
    return it == options_.end() ? T{} : cast<T>(const_cast<std::any&>(it->second), piece);
  }

 private:
  template <typename T>
  static T& cast(std::any& slot, const std::string& piece) {
    if (T* t = std::any_cast<T>(&slot)) return *t;
    throw_type_mismatch(piece);
  }
  [[noreturn]] static void throw_type_mismatch(const std::string& piece);
  std::map<std::string, std::any> options_;
};

}  // namespace crucible
