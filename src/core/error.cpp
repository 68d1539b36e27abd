// Exit-code mapping and errno formatting for crucible::Error.
#include "crucible/core/error.h"

#include <cstring>

namespace crucible {

int exit_code(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kBadInput:
      return 2;
    case ErrorKind::kRuntime:
      return 1;
    case ErrorKind::kDiverged:
      return 3;
  }
  return 1;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return msg;
}

}  // namespace crucible
