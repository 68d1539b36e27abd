// Metric records as JSON Lines (one object per line, written as it comes), the run folder's
// metrics.jsonl. A line is written whole or not at all (a full disk leaves the file as it was
// and throws, naming the space). Rank 0 only (law 4). Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace crucible::obs {

class JsonlWriter {
 public:
  // Appends to `path` (created if missing).
  explicit JsonlWriter(std::string path);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  void write(const nlohmann::json& record);

 private:
  std::string path_;
  int fd_ = -1;
};

// Atomically rewrites `path` keeping only the records for which `keep` is true (used on
// resume to drop records past the checkpoint's step). Lines that are not JSON (a torn last
// line after a crash) are dropped. Missing file: nothing to do.
void filter_jsonl(const std::string& path, const std::function<bool(const nlohmann::json&)>& keep);

}  // namespace crucible::obs
