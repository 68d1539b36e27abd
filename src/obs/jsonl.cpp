// JsonlWriter and filter_jsonl.
#include "crucible/obs/jsonl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::obs {

JsonlWriter::JsonlWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error("cannot open {} for appending: {}", path_, errno_text(errno));
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(const nlohmann::json& record) { append_whole(fd_, path_, record.dump() + "\n"); }

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
