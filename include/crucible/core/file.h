// Files that are never half-written (law 5) and whole-file reads with precise errors.
// AtomicFile writes to a temporary file in the target's folder, then commit() fsyncs it,
// renames it over the target and fsyncs the folder; a writer destroyed without commit()
// removes its temporary file, so a crash leaves either the old file or the new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace crucible {

class AtomicFile {
 public:
  // Opens "<path>.tmp-<pid>" for writing. Throws runtime_error (naming the path) on failure.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws on a failed or short write (disk full names the path).
  void write(const void* data, size_t size);
  void write(std::string_view data) { write(data.data(), data.size()); }
  // Bytes written so far.
  uint64_t size() const { return size_; }

  // fsync, rename over the target, fsync the folder. After commit the object is inert.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes `data` to `path` atomically (AtomicFile in one call).
void write_file_atomic(const std::string& path, std::string_view data);

// Makes a finished temporary file `tmp` (written by another library) durable as `path`:
// fsync it, rename it over `path`, fsync the folder. Removes `tmp` on failure.
void commit_file(const std::string& tmp, const std::string& path);

// Opens `path` read-only (close-on-exec) and checks that it is a regular file; returns the file
// descriptor (the caller closes it) and sets *size from fstat. Throws bad_input naming the path
// when it is missing or not a regular file.
int open_regular_file(const std::string& path, size_t* size);

// Reads a whole file. Throws bad_input naming the path when it is missing or unreadable.
std::string read_file(const std::string& path);

// The same into storage that is not zero-filled first (an image folder reads a file a sample).
struct FileBytes {
  std::shared_ptr<uint8_t[]> data;
  size_t size = 0;
};
FileBytes read_file_bytes(const std::string& path);

// fsyncs a folder so that renames and creations inside it are durable.
void fsync_dir(const std::string& dir);

// Temporary files left by an AtomicFile that never committed look like "<name>.tmp-<pid>".
bool is_atomic_temp_name(std::string_view file_name);

}  // namespace crucible
