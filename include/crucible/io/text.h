// Delimited text arrays, the equivalents of np.loadtxt / np.savetxt for 1-D and 2-D data:
// a delimiter (whitespace by default), comment prefix, skipped header rows, a column
// selection, and the number format. Values read as float64; a bad token is named by line and
// column. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "crucible/io/array.h"

namespace crucible::io {

struct TextOptions {
  std::string delimiter;          // "" = whitespace runs, or "," when the first data line has commas
  std::string comments = "#";     // text from this prefix to the end of a line is ignored ("" = none)
  int64_t skip_rows = 0;          // lines skipped at the start (before comments are considered)
  std::vector<int64_t> use_cols;  // columns to keep, in this order (empty = all; negative counts from the end)
  std::string fmt = "%.18e";      // savetxt: one printf conversion for a double
};

// Parses text into float64 [rows, cols]; like np.loadtxt, a single column or a single row
// gives a 1-D array. Empty input gives shape [0].
Array parse_text(const char* data, size_t size, const std::string& name, const TextOptions& options);
Array read_text(const std::string& path, const TextOptions& options);

// Writes a 0-D, 1-D (one value per line) or 2-D array with options.fmt and the delimiter
// (a space when empty), atomically.
void write_text(const std::string& path, const Array& array, const TextOptions& options);

}  // namespace crucible::io
