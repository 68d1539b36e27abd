// ConfigSchema: binding, TOML loading (toml++), overrides, validation and rendering.
#include "crucible/core/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "crucible/core/error.h"

namespace crucible {
namespace {

const char* type_name(ConfigType t) {
  switch (t) {
    case ConfigType::kBool:
      return "boolean";
    case ConfigType::kInt:
      return "integer";
    case ConfigType::kFloat:
      return "number";
    case ConfigType::kString:
      return "string";
    case ConfigType::kFloatList:
      return "list of numbers";
    case ConfigType::kStringList:
      return "list of strings";
  }
  return "?";
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string toml_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);  // shortest representation that round-trips
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string render(const ConfigValue& v) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return toml_double(d); }
    std::string operator()(const std::string& s) const { return toml_string(s); }
    std::string operator()(const std::vector<double>& l) const {
      std::string out = "[";
      for (size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + toml_double(l[i]);
      return out + "]";
    }
    std::string operator()(const std::vector<std::string>& l) const {
      std::string out = "[";
      for (size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + toml_string(l[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

std::string describe(const ConfigValue& v) {
  static const char* kNames[] = {"boolean", "integer", "number", "string", "list", "list"};
  return fmt::format("{} {}", kNames[v.index()], render(v));
}

// Reads a TOML node as a ConfigValue; `where` names it for messages.
ConfigValue from_node(const toml::node& node, const std::string& where) {
  if (auto b = node.as_boolean()) return b->get();
  if (auto i = node.as_integer()) return static_cast<int64_t>(i->get());
  if (auto f = node.as_floating_point()) return f->get();
  if (auto s = node.as_string()) return s->get();
  if (auto a = node.as_array()) {
    if (!a->empty() && (*a)[0].is_string()) {
      std::vector<std::string> words;
      for (const toml::node& e : *a) {
        auto es = e.as_string();
        if (!es) throw bad_input("{}: expected a list of strings, found a list that mixes strings and other values", where);
        words.push_back(es->get());
      }
      return words;
    }
    std::vector<double> out;
    for (const toml::node& e : *a) {
      if (auto ei = e.as_integer()) {
        out.push_back(static_cast<double>(ei->get()));
      } else if (auto ef = e.as_floating_point()) {
        out.push_back(ef->get());
      } else {
        throw bad_input("{}: expected a list of numbers, found a list holding a {}", where,
                        toml::impl::node_type_friendly_names[static_cast<int>(e.type())]);
      }
    }
    return out;
  }
  throw bad_input("{}: unsupported TOML value (tables, dates and times are not config values)", where);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// " (did you mean 'x'?)" when one candidate is close to `name`, else "".
std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

}  // namespace

ConfigKey::ConfigKey(std::string section, std::string key, std::string help, ConfigType type,
                     std::function<void(const ConfigValue&)> set, std::function<ConfigValue()> get)
    : section_(std::move(section)),
      key_(std::move(key)),
      help_(std::move(help)),
      type_(type),
      set_(std::move(set)),
      get_(std::move(get)) {
  default_toml_ = render(get_());
}

ConfigKey& ConfigKey::min(double lo, bool exclusive) {
  has_min_ = true;
  min_ = lo;
  min_exclusive_ = exclusive;
  return *this;
}

ConfigKey& ConfigKey::max(double hi, bool exclusive) {
  has_max_ = true;
  max_ = hi;
  max_exclusive_ = exclusive;
  return *this;
}

ConfigKey& ConfigKey::choices(std::vector<std::string> allowed) {
  choices_ = std::move(allowed);
  return *this;
}

std::string ConfigKey::allowed_text() const {
  if (!choices_.empty()) {
    std::vector<std::string> quoted;
    for (const auto& c : choices_) quoted.push_back("\"" + c + "\"");
    return "one of " + join(quoted, ", ");
  }
  std::string out = type_name(type_);
  auto num = [](double d) { return fmt::format("{}", d); };
  if (has_min_ && has_max_) {
    out += fmt::format(" in {}{}, {}{}", min_exclusive_ ? "(" : "[", num(min_), num(max_),
                       max_exclusive_ ? ")" : "]");
  } else if (has_min_) {
    out += fmt::format(" {} {}", min_exclusive_ ? ">" : ">=", num(min_));
  } else if (has_max_) {
    out += fmt::format(" {} {}", max_exclusive_ ? "<" : "<=", num(max_));
  }
  return out;
}

std::string ConfigKey::current_toml() const { return render(get_()); }

void ConfigKey::assign(const ConfigValue& value, const std::string& origin) {
  const std::string where = fmt::format("{}: {}", origin, full_name());
  auto wrong_type = [&]() {
    return bad_input("{}: expected {}, found {}", where, allowed_text(), describe(value));
  };
  ConfigValue v = value;
  switch (type_) {
    case ConfigType::kBool:
      if (!std::holds_alternative<bool>(v)) throw wrong_type();
      break;
    case ConfigType::kInt:
      if (!std::holds_alternative<int64_t>(v)) throw wrong_type();
      break;
    case ConfigType::kFloat:
      if (auto* i = std::get_if<int64_t>(&v)) v = static_cast<double>(*i);
      if (!std::holds_alternative<double>(v)) throw wrong_type();
      break;
    case ConfigType::kString:
      if (!std::holds_alternative<std::string>(v)) throw wrong_type();
      break;
    case ConfigType::kFloatList:
      if (auto* d = std::get_if<double>(&v)) v = std::vector<double>{*d};
      if (auto* i = std::get_if<int64_t>(&v)) v = std::vector<double>{static_cast<double>(*i)};
      if (!std::holds_alternative<std::vector<double>>(v)) throw wrong_type();
      break;
    case ConfigType::kStringList:
      if (auto* s = std::get_if<std::string>(&v)) v = std::vector<std::string>{*s};
      if (auto* l = std::get_if<std::vector<double>>(&v); l != nullptr && l->empty()) v = std::vector<std::string>{};
      if (!std::holds_alternative<std::vector<std::string>>(v)) throw wrong_type();
      break;
  }
  auto in_range = [&](double x) {
    if (std::isnan(x)) return false;
    if (has_min_ && (min_exclusive_ ? !(x > min_) : !(x >= min_))) return false;
    if (has_max_ && (max_exclusive_ ? !(x < max_) : !(x <= max_))) return false;
    return true;
  };
  auto out_of_range = [&]() {
    return bad_input("{} = {} is out of range: must be {}", where, render(v), allowed_text());
  };
  if (auto* i = std::get_if<int64_t>(&v)) {
    if (!in_range(static_cast<double>(*i))) throw out_of_range();
  } else if (auto* d = std::get_if<double>(&v)) {
    if (!in_range(*d)) throw out_of_range();
  } else if (auto* l = std::get_if<std::vector<double>>(&v)) {
    for (double x : *l) {
      if (!in_range(x)) throw out_of_range();
    }
  } else if (auto* s = std::get_if<std::string>(&v)) {
    if (!choices_.empty() && std::find(choices_.begin(), choices_.end(), *s) == choices_.end()) {
      throw bad_input("{} = {} is not allowed: expected {}{}", where, render(v), allowed_text(),
                      suggestion(*s, choices_));
    }
  }
  set_(v);
}

ConfigKey& ConfigSchema::add_key(std::unique_ptr<ConfigKey> key) {
  if (find(key->section(), key->key()) != nullptr) {
    throw std::logic_error("config key registered twice: " + key->full_name());
  }
  keys_.push_back(std::move(key));
  return *keys_.back();
}

template <typename T>
ConfigKey& ConfigSchema::bind(const std::string& section, const std::string& key, T* field, std::string help,
                              ConfigType type) {
  return add_key(std::unique_ptr<ConfigKey>(new ConfigKey(
      section, key, std::move(help), type, [field](const ConfigValue& v) { *field = std::get<T>(v); },
      [field] { return ConfigValue(*field); })));
}

ConfigKey& ConfigSchema::add_custom(const std::string& section, const std::string& key, std::string help,
                                    ConfigType type, std::function<void(const ConfigValue&)> set,
                                    std::function<ConfigValue()> get) {
  return add_key(std::unique_ptr<ConfigKey>(
      new ConfigKey(section, key, std::move(help), type, std::move(set), std::move(get))));
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, bool* field, std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kBool);
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, int64_t* field, std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kInt);
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, double* field, std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kFloat);
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, std::string* field,
                             std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kString);
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, std::vector<std::string>* field,
                             std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kStringList);
}

ConfigKey& ConfigSchema::add(const std::string& section, const std::string& key, std::vector<double>* field,
                             std::string help) {
  return bind(section, key, field, std::move(help), ConfigType::kFloatList);
}

const ConfigKey* ConfigSchema::find(const std::string& section, const std::string& key) const {
  return const_cast<ConfigSchema*>(this)->find_mutable(section, key);
}

std::vector<const ConfigKey*> ConfigSchema::keys() const {
  std::vector<const ConfigKey*> out;
  for (const auto& k : keys_) out.push_back(k.get());
  return out;
}

std::vector<std::string> ConfigSchema::sections() const {
  std::vector<std::string> out;
  for (const auto& k : keys_) {
    if (std::find(out.begin(), out.end(), k->section()) == out.end()) out.push_back(k->section());
  }
  return out;
}

void ConfigSchema::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_input("cannot read config file {}: {}", path, errno_text(errno));
  std::ostringstream text;
  text << in.rdbuf();
  load_string(text.str(), path);
}

void ConfigSchema::load_string(const std::string& toml_text, const std::string& origin) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    throw bad_input("{}:{}:{}: invalid TOML: {}", origin, e.source().begin.line, e.source().begin.column,
                    e.description());
  }
  const auto all = sections();
  for (auto&& [name, node] : doc) {
    const std::string section(name.str());
    const std::string at = fmt::format("{}:{}", origin, node.source().begin.line);
    if (std::find(all.begin(), all.end(), section) == all.end()) {
      throw bad_input("{}: unknown section [{}]{}; sections are: {}", at, section, suggestion(section, all),
                      join(all, ", "));
    }
    const toml::table* table = node.as_table();
    if (table == nullptr) throw bad_input("{}: '{}' must be a [{}] table of keys, found a value", at, section, section);
    for (auto&& [kname, value] : *table) {
      const std::string key(kname.str());
      const std::string where = fmt::format("{}:{}", origin, value.source().begin.line);
      ConfigKey* k = find_mutable(section, key);
      if (k == nullptr) throw unknown_key(where, section, key);
      k->assign(from_node(value, where + ": " + k->full_name()), where);
    }
  }
}

Error ConfigSchema::unknown_key(const std::string& where, const std::string& section, const std::string& key) const {
  const auto all = sections();
  if (std::find(all.begin(), all.end(), section) == all.end()) {
    return bad_input("{}: unknown section '{}'{}; sections are: {}", where, section, suggestion(section, all),
                     join(all, ", "));
  }
  std::vector<std::string> names;
  for (const auto& c : keys_) {
    if (c->section() == section) names.push_back(c->key());
  }
  return bad_input("{}: unknown key '{}.{}'{}; keys in [{}] are: {}", where, section, key, suggestion(key, names),
                   section, join(names, ", "));
}

ConfigKey* ConfigSchema::find_mutable(const std::string& section, const std::string& key) {
  for (const auto& k : keys_) {
    if (k->section() == section && k->key() == key) return k.get();
  }
  return nullptr;
}

void ConfigSchema::apply_override(const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw bad_input("--set {}: expected section.key=value (for example --set optim.lr=0.001)", assignment);
  }
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string text = assignment.substr(eq + 1);
  ConfigKey* k = find_mutable(section, key);
  if (k == nullptr) throw unknown_key("--set " + assignment, section, key);
  ConfigValue value;
  bool parsed = false;
  try {
    toml::table t = toml::parse("v = " + text);
    if (const toml::node* n = t.get("v")) {
      value = from_node(*n, "--set " + k->full_name());
      parsed = true;
    }
  } catch (const toml::parse_error&) {
  }
  if (k->type() == ConfigType::kString && (!parsed || !std::holds_alternative<std::string>(value))) {
    value = text;  // bare words are strings: --set run.name=baseline
    parsed = true;
  }
  if (k->type() == ConfigType::kStringList && !parsed) {
    value = std::vector<std::string>{text};  // --set model.freeze=layer1.*
    parsed = true;
  }
  if (!parsed) {
    throw bad_input("--set {}: cannot read '{}' as a value; {} expects {}", assignment, text, k->full_name(),
                    k->allowed_text());
  }
  k->assign(value, "--set");
}

std::string ConfigSchema::to_toml() const {
  std::string out;
  for (const auto& section : sections()) {
    out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    for (const auto& k : keys_) {
      if (k->section() == section) out += fmt::format("{} = {}\n", k->key(), k->current_toml());
    }
  }
  return out;
}

std::string ConfigSchema::help_text() const {
  std::string out;
  for (const auto& section : sections()) {
    out += fmt::format("  [{}]\n", section);
    for (const auto& k : keys_) {
      if (k->section() != section) continue;
      out += fmt::format("    {:<18} = {:<22} {}\n", k->key(), k->default_toml(), k->help());
      out += fmt::format("    {:<18}   {:<22} ({})\n", "", "", k->allowed_text());
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ConfigSchema::values() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : keys_) out.emplace_back(k->full_name(), k->current_toml());
  return out;
}

void PieceOptions::throw_type_mismatch(const std::string& piece) {
  throw runtime_error("piece \"{}\": its options were asked for as another type (two pieces share the name?)", piece);
}

}  // namespace crucible
