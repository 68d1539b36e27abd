// A whole file mapped into memory, private and copy-on-write: pages are read from disk only
// when touched (D13: a 2 GB array opens without reading it), and a writer (a tensor made from
// it) changes its own copy, never the file. Immutable after open; thread-safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace crucible {

class MappedFile {
 public:
  // Maps `path`. Throws bad_input naming the path when it is missing or not a regular file.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // First byte (nullptr for an empty file). Writable: a private copy-on-write mapping.
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace crucible
