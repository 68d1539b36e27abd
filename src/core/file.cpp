// AtomicFile and whole-file reads on POSIX file descriptors.
#include "crucible/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/memory.h"

namespace crucible {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_path_ = path_ + ".tmp-" + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error("cannot create {}: {}", tmp_path_, errno_text(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFile::reserve(uint64_t bytes) {
  if (fd_ < 0) throw std::logic_error("AtomicFile::reserve after commit: " + path_);
  if (bytes == 0) return;
  reserved_ = bytes;
  while (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) != 0) {
    if (errno == EINTR) continue;
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) return;  // checked by the writes instead
    throw write_error(path_, errno, 0, bytes);
  }
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) throw std::logic_error("AtomicFile::write after commit: " + path_);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw write_error(path_, errno, size_, std::max<uint64_t>(reserved_, size_ + size));
    }
    p += n;
    size -= static_cast<size_t>(n);
    size_ += static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw std::logic_error("AtomicFile::commit twice: " + path_);
  if (::fsync(fd_) != 0) throw runtime_error("cannot fsync {}: {}", tmp_path_, errno_text(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(tmp_path_.c_str());
    throw runtime_error("cannot close {}: {}", tmp_path_, errno_text(errno));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    throw runtime_error("cannot rename {} to {}: {}", tmp_path_, path_, errno_text(err));
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  fsync_dir(dir.empty() ? "." : dir);
}

int64_t free_bytes(const std::string& path) {
  std::filesystem::path p = path.empty() ? std::filesystem::path(".") : std::filesystem::path(path);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

Error write_error(const std::string& path, int err, uint64_t written, uint64_t needed) {
  if (err != ENOSPC && err != EDQUOT) {
    return runtime_error("cannot write {} ({} bytes written so far): {}", path, written, errno_text(err));
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int64_t free = free_bytes(dir.empty() ? "." : dir);
  return runtime_error("cannot write {}: {}: {} free on the file system of {}{}{}", path, errno_text(err),
                       free >= 0 ? human_bytes(static_cast<uint64_t>(free)) : std::string("an unknown amount"),
                       dir.empty() ? "." : dir, needed > 0 ? fmt::format(", the file needs {}", human_bytes(needed)) : "",
                       written > 0 ? fmt::format(" ({} written)", human_bytes(written)) : "");
}

void append_whole(int fd, const std::string& path, std::string_view data) {
  const off_t before = ::lseek(fd, 0, SEEK_END);
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (before >= 0 && ::ftruncate(fd, before) == 0) ::lseek(fd, before, SEEK_SET);  // whole records only
      throw write_error(path, err, 0, data.size());
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFile f(path);
  f.reserve(data.size());
  f.write(data);
  f.commit();
}

void commit_file(const std::string& tmp, const std::string& path) {
  int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw runtime_error("cannot fsync {}: {}", tmp, errno_text(err));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw runtime_error("cannot rename {} to {}: {}", tmp, path, errno_text(err));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_dir(dir.empty() ? "." : dir);
}

int open_regular_file(const std::string& path, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad_input("cannot open {}: {}", path, errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw runtime_error("cannot stat {}: {}", path, errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw bad_input("{} is not a regular file", path);
  }
  *size = static_cast<size_t>(st.st_size);
  return fd;
}

namespace {

// Reads the whole file at `path` with read(2) into storage from `grow(capacity, used)`, which
// returns a buffer of at least `capacity` bytes holding the `used` bytes read so far. Returns the
// size read. Not a mapping: an image folder reads thousands of small files a second, and a mapping
// of each cost page faults and, at unmap, a TLB shootdown on every core (12,000 mmap and munmap
// calls in 6 epochs of the photo set, 8% of the loader's time in the kernel).
template <typename Grow>
size_t read_whole_file(const std::string& path, Grow grow) {
  size_t size = 0;
  const int fd = open_regular_file(path, &size);
  // One byte more than the size fstat gave, so that the read that finds the end is the second
  // and a file that grew since is still read whole.
  size_t capacity = size + 1, got = 0;
  char* buffer = grow(capacity, got);
  for (;;) {
    if (got == capacity) buffer = grow(capacity *= 2, got);
    const ssize_t n = ::read(fd, buffer + got, capacity - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw runtime_error("cannot read {} ({} bytes read): {}", path, got, errno_text(err));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return got;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::string out;
  out.resize(read_whole_file(path, [&](size_t capacity, size_t) {
    out.resize(capacity);
    return out.data();
  }));
  return out;
}

FileBytes read_file_bytes(const std::string& path) {
  FileBytes out;
  out.size = read_whole_file(path, [&](size_t capacity, size_t used) {
    std::shared_ptr<uint8_t[]> bigger(new uint8_t[capacity]);  // not zero-filled: read() writes it
    if (used > 0) std::memcpy(bigger.get(), out.data.get(), used);
    out.data = std::move(bigger);
    return reinterpret_cast<char*>(out.data.get());
  });
  return out;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw runtime_error("cannot open folder {}: {}", dir, errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw runtime_error("cannot fsync folder {}: {}", dir, errno_text(err));
}

bool is_atomic_temp_name(std::string_view file_name) { return file_name.find(".tmp-") != std::string_view::npos; }

}  // namespace crucible
