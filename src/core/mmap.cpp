// MappedFile over mmap(MAP_PRIVATE).
#include "crucible/core/mmap.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  size_t size = 0;
  const int fd = open_regular_file(path, &size);
  std::shared_ptr<MappedFile> m(new MappedFile);
  m->path_ = path;
  m->size_ = size;
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
