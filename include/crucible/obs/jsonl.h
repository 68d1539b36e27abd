// Metric records as JSON Lines (one object per line, flushed as written), the run folder's
// metrics.jsonl. Rank 0 only (law 4). Not thread-safe.
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
  std::FILE* file_ = nullptr;
};

// Atomically rewrites `path` keeping only the records for which `keep` is true (used on
// resume to drop records past the checkpoint's step). Lines that are not JSON (a torn last
// line after a crash) are dropped. Missing file: nothing to do.
void filter_jsonl(const std::string& path, const std::function<bool(const nlohmann::json&)>& keep);

}  // namespace crucible::obs
