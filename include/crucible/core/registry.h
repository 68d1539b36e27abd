// Registry: named factories of one kind ("model", "loss", "optimizer"), in registration order.
// The names feed the config's allowed values and --help, and an unknown name is one error that
// lists the known ones, so adding an entry is one line where the registry is built. Torch-free
// (Factory may name forward-declared types). Built once, then read-only: thread-safe to read.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "crucible/core/error.h"

namespace crucible {

template <typename Factory>
class Registry {
 public:
  struct Entry {
    std::string name;
    std::string help;  // one line for --help and logs
    Factory factory;
  };

  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  // Adds `name`; a name registered twice is a programming error (thrown as runtime_error).
  Registry& add(std::string name, std::string help, Factory factory) {
    if (find(name) != nullptr) throw runtime_error("{} registry: \"{}\" registered twice", kind_, name);
    entries_.push_back({std::move(name), std::move(help), std::move(factory)});
    return *this;
  }

  const Entry* find(const std::string& name) const {
    for (const auto& e : entries_) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }

  // The entry for `name`, or bad_input naming `key` (e.g. "model.name") and the known names.
  const Entry& get(const std::string& name, const std::string& key) const {
    if (const Entry* e = find(name)) return *e;
    std::string known;
    for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
    throw bad_input("{}: unknown {} \"{}\" (known: {})", key, kind_, name, known);
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
  }
  const std::vector<Entry>& entries() const { return entries_; }
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::vector<Entry> entries_;
};

}  // namespace crucible
