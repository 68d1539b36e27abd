// What the sample formats' readers share (src/data/formats/*.cpp): names in messages, the class
// list of numbered labels, a mapped file's bytes as a sample, a file's magic. Private to the formats.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "crucible/core/mmap.h"
#include "crucible/data/formats/sample_source.h"

namespace crucible::data::format_detail {

inline std::string lower_ascii(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Bytes shown in a message: printable ASCII as is, anything else as \xNN; at most `limit`.
inline std::string printable(const void* data, size_t size, size_t limit = 64) {
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  for (size_t i = 0; i < size && i < limit; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      out.push_back(static_cast<char>(p[i]));
    } else {
      out += fmt::format("\\x{:02x}", p[i]);
    }
  }
  if (size > limit) out += "...";
  return out;
}

inline std::vector<std::string> numbered_classes(int64_t max_label) {
  std::vector<std::string> out;
  for (int64_t i = 0; i <= max_label; ++i) out.push_back(std::to_string(i));
  return out;
}

// A view into a mapped file, kept alive by the sample (D1: no copy).
inline EncodedSample view_of(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t size,
                      int64_t label, std::string name) {
  EncodedSample s;
  s.data = file->data() == nullptr ? nullptr : file->data() + offset;
  s.size = static_cast<size_t>(size);
  s.hold = std::shared_ptr<const void>(file, s.data);
  s.label = label;
  s.name = std::move(name);
  return s;
}

inline bool file_starts_with(const std::string& path, const char* magic, size_t n, size_t at = 0) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string buf(n, '\0');
  const bool ok = std::fseek(f, static_cast<long>(at), SEEK_SET) == 0 && std::fread(buf.data(), 1, n, f) == n;
  std::fclose(f);
  return ok && std::memcmp(buf.data(), magic, n) == 0;
}

// torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively on the path's end.
inline constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                            ".pgm", ".tif",  ".tiff", ".webp"};

inline bool has_image_extension(const std::string& name) {
  const std::string l = lower_ascii(name.size() > 8 ? name.substr(name.size() - 8) : name);
  for (const char* e : kImageExtensions) {
    if (ends_with(l, e)) return true;
  }
  return false;
}

// A format open_samples can recognise (sample_source.cpp holds their list, in the order it asks
// them): what a path of it looks like (for the message that lists them), whether `path` is one
// (`exists` and `is_dir` as the caller found them), and its opener.
struct SampleFormat {
  const char* name;
  const char* accepts;
  bool (*claims)(const std::string& path, bool exists, bool is_dir);
  std::unique_ptr<SampleSource> (*open)(const std::string& path, const SourceOptions& options);
};

}  // namespace crucible::data::format_detail
