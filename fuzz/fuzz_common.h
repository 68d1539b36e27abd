// Shared by the fuzz targets: a parser may reject any input with crucible::Error (bad input);
// any other exception, crash or sanitizer report is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

#include "crucible/core/error.h"

template <typename F>
int fuzz_one(F parse) {
  try {
    parse();
  } catch (const crucible::Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parser threw a non-crucible exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}

// A private folder under /tmp for a target whose parser reads files by path; it and the files
// named in `files` are removed when the process exits (a function-local static's destructor).
class ScratchDir {
 public:
  ScratchDir(const char* prefix, std::vector<std::string> files) : files_(std::move(files)) {
    std::string tmpl = std::string("/tmp/") + prefix + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir_ = tmpl;
  }
  ~ScratchDir() {
    for (const auto& f : files_) std::remove(path(f).c_str());
    ::rmdir(dir_.c_str());
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

// Writes `size` bytes to `path` (aborts on failure: the scratch folder is ours).
inline void write_fuzz_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}
