// MappedFile over mmap(MAP_PRIVATE).
#include "crucible/core/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "crucible/core/error.h"

namespace crucible {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
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
  std::shared_ptr<MappedFile> m(new MappedFile);
  m->path_ = path;
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw runtime_error("cannot map {} ({} bytes): {}", path, m->size_, errno_text(err));
    }
    m->data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace crucible
