// Shared by the fuzz targets: a parser may reject any input with crucible::Error (bad input);
// any other exception, crash or sanitizer report is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

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
