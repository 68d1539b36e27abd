// JsonlWriter and filter_jsonl.
#include "crucible/obs/jsonl.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::obs {

JsonlWriter::JsonlWriter(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) throw runtime_error("cannot open {} for appending: {}", path_, errno_text(errno));
}

JsonlWriter::~JsonlWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw runtime_error("cannot write {}: {}", path_, errno_text(errno));
  }
}

void filter_jsonl(const std::string& path, const std::function<bool(const nlohmann::json&)>& keep) {
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    if (keep(j)) out += line + "\n";
  }
  write_file_atomic(path, out);
}

}  // namespace crucible::obs
