// crucible::Error — the one exception type for failures a user can act on.
// Each carries a Kind that `main` maps to an exit code (law 6: loud, precise failure):
// bad input/config/usage → 2, runtime failure → 1, training diverged → 3.
// Bugs are asserts, not Errors.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace crucible {

enum class ErrorKind {
  kBadInput,  // the user's file, config or command line is wrong; exit 2
  kRuntime,   // the environment failed (I/O, out of memory, a peer died); exit 1
  kDiverged,  // training produced non-finite values; exit 3
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(std::move(message)), kind_(kind) {}

  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Exit code for an error kind: 2, 1 or 3 (see ErrorKind).
int exit_code(ErrorKind kind) noexcept;

// Builders that read like the sentence they produce:
//   throw bad_input("{}: expected magic 0x0803, found 0x{:04x}", path, magic);
template <typename... Args>
Error bad_input(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kBadInput, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error runtime_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kRuntime, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error diverged(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kDiverged, fmt::format(f, std::forward<Args>(args)...));
}

// errno as words, for messages about failed system calls.
std::string errno_text(int err);

}  // namespace crucible
