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

#include "crucible/core/error.h"

namespace crucible {

class AtomicFile {
 public:
  // Opens "<path>.tmp-<pid>" for writing. Throws runtime_error (naming the path) on failure.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Claims `bytes` of disk for the file before it is written (fallocate, the file's size
  // unchanged), so a full disk fails here, before any byte is written, naming the space free
  // and needed (write_error). A file system without fallocate is not checked.
  void reserve(uint64_t bytes);
  // Appends bytes; throws on a failed or short write (disk full names the path and the space).
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
  uint64_t reserved_ = 0;
};

// Bytes an unprivileged writer may still use on the file system holding `path` (statvfs:
// f_bavail × f_frsize; `path` or, when it does not exist yet, its nearest existing parent);
// -1 when unknown.
int64_t free_bytes(const std::string& path);

// The error for a write to `path` that failed with errno `err` after `written` bytes. On a full
// disk (ENOSPC, EDQUOT) it names the space free on the file system and the `needed` bytes
// (0: not known): "cannot write P: No space left on device: 5.4 MiB free there, the file needs
// 10.0 MiB".
Error write_error(const std::string& path, int err, uint64_t written, uint64_t needed);

// Appends `data` to the end of the file open for writing as `fd` (`path` for messages) whole
// or not at all: after a failed or short write the file is cut back to its size before, so a
// reader never finds half a record (metrics.jsonl, TensorBoard events on a full disk).
void append_whole(int fd, const std::string& path, std::string_view data);

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
