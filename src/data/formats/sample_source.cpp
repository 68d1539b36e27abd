// Sample sources (see sample_source.h): image folders (torchvision ImageFolder order), WebDataset
// tar shards with a validated "<shard>.idx" offset index, LMDB, crucible's packed shards, the
// evenly spaced subset, and open_samples' detection (brace patterns "name-{000000..000009}.tar").
#include "crucible/data/formats/sample_source.h"

#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"
#include "crucible/core/sha256.h"
#include "crucible/data/formats/pack_format.h"
#include "crucible/data/formats/shard_index.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;

// ---- small helpers ------------------------------------------------------------------------

std::string lower_ascii(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}


// Bytes shown in a message: printable ASCII as is, anything else as \xNN; at most `limit`.
std::string printable(const void* data, size_t size, size_t limit = 64) {
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

std::vector<std::string> numbered_classes(int64_t max_label) {
  std::vector<std::string> out;
  for (int64_t i = 0; i <= max_label; ++i) out.push_back(std::to_string(i));
  return out;
}

// A view into a mapped file, kept alive by the sample (D1: no copy).
EncodedSample view_of(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t size,
                      int64_t label, std::string name) {
  EncodedSample s;
  s.data = file->data() == nullptr ? nullptr : file->data() + offset;
  s.size = static_cast<size_t>(size);
  s.hold = std::shared_ptr<const void>(file, s.data);
  s.label = label;
  s.name = std::move(name);
  return s;
}

// ---- image folder -------------------------------------------------------------------------

// torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively on the path's end.
constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                            ".pgm", ".tif",  ".tiff", ".webp"};

bool has_image_extension(const std::string& name) {
  const std::string l = lower_ascii(name.size() > 8 ? name.substr(name.size() - 8) : name);
  for (const char* e : kImageExtensions) {
    if (ends_with(l, e)) return true;
  }
  return false;
}

// One folder's entries as os.walk(followlinks=True) splits them: sub-folders (symlinks to
// folders included) and everything else.
void list_folder(const std::string& dir, std::vector<std::string>* dirs, std::vector<std::string>* files) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw bad_input("cannot list folder {}: {}", dir, ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    const bool is_dir = it->is_directory(ec2);
    (is_dir ? dirs : files)->push_back(it->path().filename().string());
  }
  if (ec) throw bad_input("cannot list folder {}: {}", dir, ec.message());
}

class ImageFolderSource final : public SampleSource {
 public:
  explicit ImageFolderSource(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    std::error_code ec;
    if (!fs::exists(root_, ec)) throw bad_input("image folder {} does not exist", root_);
    if (!fs::is_directory(root_, ec)) throw bad_input("{} is not a folder (expected an image folder)", root_);
    std::vector<std::string> top_files;
    list_folder(root_, &classes_, &top_files);
    if (classes_.empty()) {
      if (top_files.empty()) throw bad_input("image folder {} is empty: expected one sub-folder per class", root_);
      throw bad_input("image folder {} holds {} files but no class sub-folders: expected one sub-folder per class",
                      root_, top_files.size());
    }
    std::sort(classes_.begin(), classes_.end());  // byte order, as Python's sorted() on names
    std::vector<std::string> empty;
    for (size_t c = 0; c < classes_.size(); ++c) {
      const size_t before = paths_.size();
      add_class(root_ + "/" + classes_[c], static_cast<int64_t>(c));
      if (paths_.size() == before) empty.push_back(classes_[c]);
    }
    if (!empty.empty()) {
      // torchvision refuses such a folder too (FileNotFoundError): the labels would mislead.
      std::string list;
      for (const auto& e : empty) list += (list.empty() ? "" : ", ") + e;
      throw bad_input("image folder {}: no image file in the class folders {}; expected files ending in .jpg .jpeg "
                      ".png .ppm .bmp .pgm .tif .tiff .webp (any case)",
                      root_, list);
    }
  }

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }

  EncodedSample get(int64_t index) const override {
    const std::string& path = paths_.at(static_cast<size_t>(index));
    FileBytes bytes = read_file_bytes(path);  // names the path on failure
    EncodedSample s;
    s.data = bytes.data.get();
    s.size = bytes.size;
    s.hold = std::move(bytes.data);
    s.label = labels_[static_cast<size_t>(index)];
    s.name = path;
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("image folder {}: {} samples in {} classes", root_, paths_.size(), classes_.size());
  }
  int files_per_read() const override { return 1; }  // D6: get() opens, reads, closes

 private:
  // torchvision: `for root, _, fnames in sorted(os.walk(dir, followlinks=True))` then
  // `sorted(fnames)`: every folder below the class folder, ordered by its whole path string
  // (so "a-x" comes before "a/b"), each contributing its own files in name order.
  void add_class(const std::string& class_dir, int64_t label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    std::vector<std::string> stack = {class_dir};
    while (!stack.empty()) {
      std::string dir = std::move(stack.back());
      stack.pop_back();
      std::vector<std::string> dirs, files;
      list_folder(dir, &dirs, &files);
      for (const auto& d : dirs) stack.push_back(dir + "/" + d);
      folders.emplace_back(std::move(dir), std::move(files));
    }
    std::sort(folders.begin(), folders.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [dir, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        if (!has_image_extension(f)) continue;
        paths_.push_back(dir + "/" + f);
        labels_.push_back(label);
      }
    }
  }

  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
};

// ---- tar shards ---------------------------------------------------------------------------

using TarSample = TarMember;
using TarIndex = TarShardIndex;

constexpr size_t kBlock = 512;

// An octal numeric field: optional leading spaces/NULs, octal digits, ended by NUL, space or
// the field's end. Base-256 (GNU, for sizes ≥ 8 GiB): the first byte has bit 7 set.
bool parse_numeric(const uint8_t* f, size_t n, uint64_t* out) {
  if (f[0] & 0x80) {
    if (f[0] == 0xff) return false;  // negative
    uint64_t v = f[0] & 0x7f;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 56) return false;
      v = v << 8 | f[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (v >> 61) return false;
    v = v << 3 | static_cast<uint64_t>(f[i] - '0');
    any = true;
  }
  for (; i < n; ++i) {
    if (f[i] != ' ' && f[i] != 0) return false;
  }
  if (!any) v = 0;
  *out = v;
  return true;
}

std::string field_string(const uint8_t* f, size_t n) {
  return std::string(reinterpret_cast<const char*>(f), strnlen(reinterpret_cast<const char*>(f), n));
}

// Pax extended header records "<len> <key>=<value>\n"; returns path and size when present.
void parse_pax(const uint8_t* p, uint64_t n, const std::string& shard, uint64_t at, std::string* path,
               uint64_t* size, bool* has_size) {
  uint64_t i = 0;
  while (i < n) {
    uint64_t len = 0, j = i;
    while (j < n && p[j] >= '0' && p[j] <= '9' && len < (uint64_t{1} << 40)) len = len * 10 + (p[j++] - '0');
    if (j == i || j >= n || p[j] != ' ' || len <= j - i + 1 || len > n - i || p[i + len - 1] != '\n') {
      throw bad_input("{}: malformed pax extended header at byte {} (record at offset {})", shard, at, i);
    }
    std::string rec(reinterpret_cast<const char*>(p + j + 1), static_cast<size_t>(len - (j - i) - 2));
    const size_t eq = rec.find('=');
    if (eq == std::string::npos) throw bad_input("{}: pax record without '=' at byte {}", shard, at);
    const std::string key = rec.substr(0, eq), value = rec.substr(eq + 1);
    if (key == "path") *path = value;
    if (key == "size") {
      uint64_t v = 0;
      auto r = std::from_chars(value.data(), value.data() + value.size(), v);
      if (r.ec != std::errc() || r.ptr != value.data() + value.size()) {
        throw bad_input("{}: pax size \"{}\" at byte {} is not a number", shard, printable(value.data(), value.size()),
                        at);
      }
      *size = v;
      *has_size = true;
    }
    i += len;
  }
}

bool is_image_field(const std::string& field) {
  const size_t dot = field.rfind('.');
  const std::string ext = dot == std::string::npos ? field : field.substr(dot + 1);
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

bool is_label_field(const std::string& field) {
  return field == "cls" || field == "cls.txt" || field == "label" || field == "label.txt";
}

int64_t parse_label(const uint8_t* p, uint64_t n, const std::string& shard, const std::string& member, uint64_t at) {
  uint64_t b = 0, e = n;
  auto space = [](uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (b < e && space(p[b])) ++b;
  while (e > b && space(p[e - 1])) --e;
  const char* first = reinterpret_cast<const char*>(p + b);
  const char* last = reinterpret_cast<const char*>(p + e);
  if (first != last && *first == '+') ++first;
  int64_t v = 0;
  auto r = std::from_chars(first, last, v);
  if (b == e || r.ec != std::errc() || r.ptr != last || v < -1) {
    throw bad_input("{}: label member {} at byte {} should hold a decimal integer >= -1, found \"{}\"", shard, member,
                    at, printable(p, static_cast<size_t>(n)));
  }
  return v;
}

// Walks the 512-byte headers of a mapped tar shard with bounds checks and groups members into
// WebDataset samples (key = directory + base name up to its first '.').
TarIndex index_tar(const uint8_t* data, uint64_t size, const std::string& shard) {
  TarIndex index;

  bool open_group = false;
  TarSample cur;
  bool cur_has_image = false, cur_has_label = false;
  auto flush = [&] {
    if (!open_group) return;
    if (cur_has_image) {
      index.samples.push_back(cur);
    } else {
      ++index.skipped;
    }
    open_group = false;
  };

  std::string long_name, pax_path;
  uint64_t pax_size = 0;
  bool has_pax_size = false;
  uint64_t off = 0;
  for (;;) {
    if (off == size) {
      throw bad_input("{}: the tar archive ends at byte {} without its end-of-archive block (truncated?)", shard, off);
    }
    if (size - off < kBlock) {
      throw bad_input("{}: truncated tar header at byte {}: expected 512 bytes, found {}", shard, off, size - off);
    }
    const uint8_t* h = data + off;
    if (std::all_of(h, h + kBlock, [](uint8_t c) { return c == 0; })) break;  // end of archive

    uint64_t stored = 0;
    const bool chk_ok = parse_numeric(h + 148, 8, &stored);
    uint64_t unsigned_sum = 0;
    int64_t signed_sum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      const uint8_t c = (i >= 148 && i < 156) ? uint8_t{' '} : h[i];
      unsigned_sum += c;
      signed_sum += static_cast<int8_t>(c);
    }
    if (!chk_ok || (stored != unsigned_sum && static_cast<int64_t>(stored) != signed_sum)) {
      throw bad_input("{}: bad tar header checksum at byte {}: stored \"{}\", computed {:o} (corrupt or not a tar file)",
                      shard, off, printable(h + 148, 8), unsigned_sum);
    }
    uint64_t member_size = 0;
    if (!parse_numeric(h + 124, 12, &member_size)) {
      throw bad_input("{}: bad size field \"{}\" in the tar header at byte {}", shard, printable(h + 124, 12), off);
    }
    const char type = static_cast<char>(h[156]);
    const bool extension = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    if (!extension && has_pax_size) member_size = pax_size;

    std::string name;
    if (!long_name.empty()) {
      name = long_name;
    } else if (!pax_path.empty()) {
      name = pax_path;
    } else {
      name = field_string(h, 100);
      if (std::memcmp(h + 257, "ustar\0", 6) == 0) {  // POSIX ustar: prefix field (GNU uses it otherwise)
        const std::string prefix = field_string(h + 345, 155);
        if (!prefix.empty()) name = prefix + "/" + name;
      }
    }

    const uint64_t data_off = off + kBlock;
    if (member_size > size - data_off) {
      throw bad_input("{}: member \"{}\" (header at byte {}) needs {} bytes but the file ends at byte {} (truncated)",
                      shard, printable(name.data(), name.size(), 200), off, member_size, size);
    }
    const uint8_t* body = data + data_off;

    if (type == 'L') {
      long_name = field_string(body, static_cast<size_t>(member_size));
    } else if (type == 'x') {
      parse_pax(body, member_size, shard, off, &pax_path, &pax_size, &has_pax_size);
    } else if (type == 'K' || type == 'g') {
      // long link name / global pax header: nothing crucible needs
    } else {
      const bool regular = (type == '0' || type == '\0' || type == '7') && !ends_with(name, "/");
      if (regular) {
        const size_t slash = name.rfind('/');
        const size_t base = slash == std::string::npos ? 0 : slash + 1;
        const size_t dot = name.find('.', base);
        // WebDataset ignores members whose base name has no '.' (or starts with one).
        if (dot != std::string::npos && dot > base) {
          std::string key = name.substr(0, dot);
          const std::string field = lower_ascii(name.substr(dot + 1));
          if (!open_group || key != cur.key) {
            flush();
            open_group = true;
            cur = TarSample{};
            cur.key = std::move(key);
            cur_has_image = cur_has_label = false;
          }
          if (!cur_has_image && is_image_field(field)) {
            cur.offset = data_off;
            cur.size = member_size;
            cur_has_image = true;
          } else if (!cur_has_label && is_label_field(field)) {
            cur.label = parse_label(body, member_size, shard, name, off);
            cur_has_label = true;
          }
        }
      }
      long_name.clear();
      pax_path.clear();
      has_pax_size = false;
    }
    const uint64_t padded = (member_size + kBlock - 1) / kBlock * kBlock;
    if (padded > size - data_off) {
      throw bad_input("{}: member \"{}\" (header at byte {}) is not padded to 512 bytes: the file ends at byte {} "
                      "(truncated)",
                      shard, printable(name.data(), name.size(), 200), off, size);
    }
    off = data_off + padded;
  }
  flush();
  return index;
}

// "<shard>.idx": "CRTARIX2", u64 shard size, i64 shard mtime (ns), the shard's SHA-256 (32 raw
// bytes), u64 skipped, u64 count, then count × {u64 offset, u64 size, i64 label, u32 key length,
// key bytes}, then u32 CRC-32 of all the bytes before it. Everything little-endian. "CRTARIX1",
// written before the hash was recorded, is the same without the SHA-256: still read.
constexpr char kTarIndexMagicV1[8] = {'C', 'R', 'T', 'A', 'R', 'I', 'X', '1'};
constexpr char kTarIndexMagic[8] = {'C', 'R', 'T', 'A', 'R', 'I', 'X', '2'};

// Raw bytes from lower-case hex (false unless 2n hex digits); to_hex (core/sha256.h) is the way there.
bool from_hex(const std::string& hex, std::string* raw) {
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  raw->clear();
  if (hex.size() % 2 != 0) return false;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    raw->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}

// An empty `sha256` writes the old format (CRTARIX1).
std::string encode_tar_index(const TarIndex& index, uint64_t shard_size, int64_t mtime_ns, const std::string& sha256) {
  std::string raw_sha;
  if (!sha256.empty() && (!from_hex(sha256, &raw_sha) || raw_sha.size() != 32)) {
    throw std::invalid_argument("encode_tar_index: expected a SHA-256 of 64 hex digits, found \"" + sha256 + "\"");
  }
  std::string out(sha256.empty() ? kTarIndexMagicV1 : kTarIndexMagic, 8);
  append_le64(out, shard_size);
  append_le64(out, static_cast<uint64_t>(mtime_ns));
  out += raw_sha;
  append_le64(out, index.skipped);
  append_le64(out, index.samples.size());
  for (const auto& s : index.samples) {
    append_le64(out, s.offset);
    append_le64(out, s.size);
    append_le64(out, static_cast<uint64_t>(s.label));
    append_le32(out, static_cast<uint32_t>(s.key.size()));
    out += s.key;
  }
  append_le32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size()))));
  return out;
}

// A sidecar's index, the size and mtime of the shard it describes and its SHA-256 (hex; empty
// in the old format); false when damaged.
bool decode_tar_index(const std::string& raw, TarIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                      std::string* sha256) {
  const auto* p = reinterpret_cast<const uint8_t*>(raw.data());
  const size_t n = raw.size();
  if (n < 8) return false;
  const bool v1 = std::memcmp(p, kTarIndexMagicV1, 8) == 0;
  if (!v1 && std::memcmp(p, kTarIndexMagic, 8) != 0) return false;
  const size_t hash_bytes = v1 ? 0 : 32;
  if (n < 44 + hash_bytes) return false;
  if (crc32(0, p, static_cast<uInt>(n - 4)) != load_le32(p + n - 4)) return false;
  const uint64_t size = load_le64(p + 8);
  TarIndex out;
  size_t at = 24 + hash_bytes;
  out.skipped = load_le64(p + at);
  const uint64_t count = load_le64(p + at + 8);
  at += 16;
  const size_t end = n - 4;
  if (count > (end - at) / 28) return false;
  out.samples.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    if (end - at < 28) return false;
    TarSample s;
    s.offset = load_le64(p + at);
    s.size = load_le64(p + at + 8);
    s.label = static_cast<int64_t>(load_le64(p + at + 16));
    const uint32_t key_len = load_le32(p + at + 24);
    at += 28;
    if (key_len > end - at || s.offset > size || s.size > size - s.offset || s.label < -1) return false;
    s.key.assign(reinterpret_cast<const char*>(p + at), key_len);
    at += key_len;
    out.samples.push_back(std::move(s));
  }
  if (at != end) return false;
  *index = std::move(out);
  *shard_size = size;
  *mtime_ns = static_cast<int64_t>(load_le64(p + 16));
  if (sha256 != nullptr) *sha256 = v1 ? "" : to_hex(p + 24, 32);
  return true;
}

// The sidecar index when it exists, is intact and matches the shard, with the shard's SHA-256
// (empty from an old sidecar); otherwise false.
bool read_tar_index(const std::string& path, uint64_t shard_size, int64_t mtime_ns, TarIndex* index,
                    std::string* sha256) {
  std::string raw;
  try {
    raw = read_file(path);
  } catch (const Error&) {
    return false;
  }
  TarIndex out;
  uint64_t size = 0;
  int64_t mtime = 0;
  if (!decode_tar_index(raw, &out, &size, &mtime, sha256) || size != shard_size || mtime != mtime_ns) return false;
  *index = std::move(out);
  return true;
}

class TarShardSource final : public SampleSource {
 public:
  explicit TarShardSource(const std::vector<std::string>& shards) : names_(shards) {
    if (shards.empty()) throw bad_input("no tar shards given");
    int64_t max_label = -1;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string& shard = shards[i];
      auto file = MappedFile::open(shard);  // bad_input naming a missing shard
      struct stat st {};
      if (::stat(shard.c_str(), &st) != 0) throw runtime_error("cannot stat {}: {}", shard, errno_text(errno));
      const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
      TarIndex index;
      std::string sha256;
      const std::string idx_path = shard + ".idx";
      bool write = false;
      if (static_cast<uint64_t>(st.st_size) == file->size() &&
          read_tar_index(idx_path, file->size(), mtime_ns, &index, &sha256)) {
        ++indexes_read_;
        // An index from before the hash was recorded: given it where the folder takes writes (a
        // remote copy of the shard is verified by it), once.
        const fs::path folder = fs::path(idx_path).parent_path();
        write = sha256.empty() && ::access(folder.empty() ? "." : folder.c_str(), W_OK) == 0;
        hashes_added_ += write;
      } else {
        index = index_tar(file->data(), file->size(), shard);
        ++indexes_built_;
        write = true;
      }
      if (write) {
        try {
          const std::string_view bytes(reinterpret_cast<const char*>(file->data()), file->size());
          write_file_atomic(idx_path, encode_tar_index(index, file->size(), mtime_ns, sha256_hex(bytes)));
        } catch (const Error&) {
          // a read-only folder: the index is rebuilt at the next open
        }
      }
      skipped_ += index.skipped;
      for (auto& s : index.samples) {
        max_label = std::max(max_label, s.label);
        records_.push_back({static_cast<uint32_t>(i), s.offset, s.size, s.label, std::move(s.key)});
      }
      files_.push_back(std::move(file));
    }
    classes_ = numbered_classes(max_label);
  }

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

  EncodedSample get(int64_t index) const override {
    const Record& r = records_.at(static_cast<size_t>(index));
    return view_of(files_[r.shard], r.offset, r.size, r.label, names_[r.shard] + ":" + r.key);
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<int64_t> shard_counts() const override { return contiguous_shard_counts(records_, files_.size()); }

  std::string describe() const override {
    return fmt::format("{} tar shard{} ({}{}): {} samples, {} skipped without an image; offset indexes: {} read from "
                       ".idx, {} built{}",
                       names_.size(), names_.size() == 1 ? "" : "s", names_.front(), names_.size() > 1 ? ", ..." : "",
                       records_.size(), skipped_, indexes_read_, indexes_built_,
                       hashes_added_ > 0 ? fmt::format(", {} given the shard's SHA-256", hashes_added_) : "");
  }

 private:
  struct Record {
    uint32_t shard;
    uint64_t offset;
    uint64_t size;
    int64_t label;
    std::string key;
  };
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<Record> records_;
  std::vector<std::string> classes_;
  uint64_t skipped_ = 0;
  int indexes_read_ = 0;
  int indexes_built_ = 0;
  int hashes_added_ = 0;  // old indexes rewritten with the shard's SHA-256
};

// ---- LMDB ---------------------------------------------------------------------------------

constexpr const char* kLmdbClassesKey = "__classes__";

struct LmdbEnv {
  MDB_env* env = nullptr;
  MDB_dbi dbi = 0;
  LmdbEnv() = default;
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;
  ~LmdbEnv() {
    if (env != nullptr) mdb_env_close(env);
  }
};

// A read transaction that keeps its values valid; it keeps the environment open (frees first).
struct LmdbTxn {
  std::shared_ptr<const LmdbEnv> env;
  MDB_txn* txn = nullptr;
  LmdbTxn(const LmdbTxn&) = delete;
  LmdbTxn& operator=(const LmdbTxn&) = delete;
  explicit LmdbTxn(std::shared_ptr<const LmdbEnv> e) : env(std::move(e)) {}
  ~LmdbTxn() {
    if (txn != nullptr) mdb_txn_abort(txn);
  }
};

int64_t lmdb_label(uint32_t v) { return v == 0xffffffffu ? -1 : int64_t{v}; }

class LmdbSource final : public SampleSource {
 public:
  explicit LmdbSource(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    const bool is_dir = fs::is_directory(path_, ec);
    if (!is_dir && !fs::is_regular_file(path_, ec)) throw bad_input("LMDB {} does not exist", path_);
    if (is_dir && !fs::exists(path_ + "/data.mdb", ec)) {
      throw bad_input("LMDB folder {} holds no data.mdb", path_);
    }
    auto env = std::make_shared<LmdbEnv>();
    int rc = mdb_env_create(&env->env);
    if (rc != 0) throw runtime_error("LMDB {}: cannot create an environment: {}", path_, mdb_strerror(rc));
    // MDB_NOTLS: a read transaction is not tied to its thread, so any thread may use or free it.
    unsigned flags = MDB_RDONLY | MDB_NOLOCK | MDB_NORDAHEAD | MDB_NOTLS | (is_dir ? 0u : unsigned{MDB_NOSUBDIR});
    rc = mdb_env_open(env->env, path_.c_str(), flags, 0644);
    if (rc != 0) {
      throw bad_input("{}: cannot open as LMDB: {}", path_, mdb_strerror(rc));
    }
    MDB_txn* txn = nullptr;
    rc = mdb_txn_begin(env->env, nullptr, MDB_RDONLY, &txn);
    if (rc != 0) throw runtime_error("LMDB {}: cannot begin a read transaction: {}", path_, mdb_strerror(rc));
    LmdbTxn guard(env);
    guard.txn = txn;
    rc = mdb_dbi_open(txn, nullptr, 0, &env->dbi);
    if (rc != 0) throw bad_input("LMDB {}: cannot open the main database: {}", path_, mdb_strerror(rc));
    MDB_cursor* cursor = nullptr;
    rc = mdb_cursor_open(txn, env->dbi, &cursor);
    if (rc != 0) throw runtime_error("LMDB {}: cannot open a cursor: {}", path_, mdb_strerror(rc));
    std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> cursor_guard(cursor, mdb_cursor_close);
    MDB_val key, value;
    int64_t max_label = -1;
    bool have_classes = false;
    for (rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
      std::string k(static_cast<const char*>(key.mv_data), key.mv_size);
      if (k == kLmdbClassesKey) {
        classes_ = parse_classes(value);
        have_classes = true;
        continue;
      }
      if (value.mv_size < 4) {
        throw bad_input("LMDB {}: the value of key \"{}\" holds {} bytes; expected a u32 label and an encoded image",
                        path_, printable(key.mv_data, key.mv_size), value.mv_size);
      }
      const int64_t label = lmdb_label(load_le32(static_cast<const uint8_t*>(value.mv_data)));
      max_label = std::max(max_label, label);
      keys_.push_back(std::move(k));
    }
    if (rc != MDB_NOTFOUND) throw runtime_error("LMDB {}: cannot iterate keys: {}", path_, mdb_strerror(rc));
    if (!have_classes) classes_ = numbered_classes(max_label);
    env_ = std::move(env);
  }

  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

  EncodedSample get(int64_t index) const override {
    const std::string& k = keys_.at(static_cast<size_t>(index));
    auto txn = std::make_shared<LmdbTxn>(env_);
    int rc = mdb_txn_begin(env_->env, nullptr, MDB_RDONLY, &txn->txn);
    if (rc != 0) {
      txn->txn = nullptr;
      throw runtime_error("LMDB {}: cannot begin a read transaction for key \"{}\": {}", path_, name_of(k),
                          mdb_strerror(rc));
    }
    MDB_val key{k.size(), const_cast<char*>(k.data())}, value{0, nullptr};
    rc = mdb_get(txn->txn, env_->dbi, &key, &value);
    if (rc != 0) throw runtime_error("LMDB {}: cannot read key \"{}\": {}", path_, name_of(k), mdb_strerror(rc));
    if (value.mv_size < 4) {
      throw bad_input("LMDB {}: the value of key \"{}\" holds {} bytes; expected a u32 label and an encoded image",
                      path_, name_of(k), value.mv_size);
    }
    const auto* p = static_cast<const uint8_t*>(value.mv_data);
    EncodedSample s;
    s.data = p + 4;
    s.size = value.mv_size - 4;
    s.hold = std::shared_ptr<const void>(std::move(txn), s.data);  // values live as long as their txn
    s.label = lmdb_label(load_le32(p));
    s.name = name_of(k);
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("LMDB {}: {} samples in {} classes", path_, keys_.size(), classes_.size());
  }
  int files_held() const override { return 1; }  // D6: data.mdb stays open (no lock file)

 private:
  static std::string name_of(const std::string& key) { return printable(key.data(), key.size(), 256); }

  std::vector<std::string> parse_classes(const MDB_val& v) const {
    try {
      auto j = nlohmann::json::parse(static_cast<const char*>(v.mv_data),
                                     static_cast<const char*>(v.mv_data) + v.mv_size);
      return j.get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw bad_input("LMDB {}: key {} should hold a JSON list of class names: {}", path_, kLmdbClassesKey, e.what());
    }
  }

  std::string path_;
  std::shared_ptr<const LmdbEnv> env_;
  std::vector<std::string> keys_;
  std::vector<std::string> classes_;
};

// ---- packed shards ------------------------------------------------------------------------

constexpr size_t kPackRecordBytes = pack_format::kRecordBytes;

class PackedSource final : public SampleSource {
 public:
  explicit PackedSource(std::string index_path) : index_path_(std::move(index_path)) {
    std::error_code ec;
    if (fs::is_directory(index_path_, ec)) index_path_ += "/index.crpk";
    const std::string& ip = index_path_;
    PackedIndex index = parse_packed_index(read_file(ip), ip);  // bad_input when missing or damaged
    classes_ = std::move(index.classes);
    shard_names_ = std::move(index.shards);
    align_ = index.align;
    mode_ = std::move(index.mode);
    const std::string dir = fs::path(ip).parent_path().string();
    for (const auto& name : shard_names_) {
      const std::string path = (dir.empty() ? name : dir + "/" + name);
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw bad_input("{}: shard {} listed in the index is missing or not a file", ip, path);
      }
      shards_.push_back(MappedFile::open(path));
      shard_paths_.push_back(path);
    }
    records_.resize(index.records.size());
    for (size_t i = 0; i < index.records.size(); ++i) {
      Record& rec = records_[i];
      const pack_format::Record& f = index.records[i];
      rec.shard = f.shard;
      rec.size = f.size;
      rec.offset = f.offset;
      rec.label = f.label;
      const uint64_t shard_size = shards_[rec.shard]->size();
      if (rec.offset > shard_size || rec.size > shard_size - rec.offset) {
        throw bad_input("{}: sample {} lies at bytes [{}, {}) of {} but the shard holds {} bytes", ip, i, rec.offset,
                        rec.offset + rec.size, shard_paths_[rec.shard], shard_size);
      }
    }
  }

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

  // Names "<dst>/<shard>#<index>" with the sample's index in the whole packed set.
  EncodedSample get(int64_t index) const override {
    const Record& r = records_.at(static_cast<size_t>(index));
    return view_of(shards_[r.shard], r.offset, r.size, r.label, fmt::format("{}#{}", shard_paths_[r.shard], index));
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<int64_t> shard_counts() const override { return contiguous_shard_counts(records_, shards_.size()); }
  std::string describe() const override {
    return fmt::format("packed {}: {} samples in {} shards (mode {}, align {})", index_path_, records_.size(),
                       shards_.size(), mode_, align_);
  }

 private:
  struct Record {
    uint32_t shard = 0;
    uint32_t size = 0;
    uint64_t offset = 0;
    int64_t label = -1;
  };
  std::string index_path_;
  std::vector<std::string> classes_;
  std::vector<std::string> shard_names_;
  std::vector<std::string> shard_paths_;
  std::vector<std::shared_ptr<const MappedFile>> shards_;
  std::vector<Record> records_;
  int64_t align_ = 0;
  std::string mode_;
};

// ---- evenly spaced subset -------------------------------------------------------------------

class EvenSubset final : public SampleSource {
 public:
  EvenSubset(std::shared_ptr<const SampleSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  EncodedSample get(int64_t index) const override {
    if (index < 0 || index >= n_) throw std::out_of_range("EvenSubset::get: index out of range");
    return base_->get(base_index(index));
  }
  const std::vector<std::string>& classes() const override { return base_->classes(); }
  std::string describe() const override { return fmt::format("{} evenly spaced samples of {}", n_, base_->describe()); }
  int files_held() const override { return base_->files_held(); }
  int files_per_read() const override { return base_->files_per_read(); }
  std::vector<int64_t> shard_counts() const override {
    const std::vector<int64_t> base = base_->shard_counts();
    if (base.empty()) return {};
    std::vector<int64_t> out(base.size(), 0);
    size_t shard = 0;
    int64_t end = base[0];
    for (int64_t i = 0; i < n_; ++i) {  // base indices grow with i
      const int64_t b = base_index(i);
      while (b >= end) end += base[++shard];
      ++out[shard];
    }
    return out;
  }
  void plan(const std::vector<int64_t>& upcoming) const override {
    std::vector<int64_t> mapped(upcoming.size());
    for (size_t k = 0; k < upcoming.size(); ++k) mapped[k] = base_index(upcoming[k]);
    base_->plan(mapped);
  }
  bool remote_io(RemoteIo* out) const override { return base_->remote_io(out); }

 private:
  // i × size / n without overflow for any size an index can hold (i < n ≤ size < 2^63).
  int64_t base_index(int64_t i) const {
    const auto wide = static_cast<unsigned __int128>(i) * static_cast<unsigned __int128>(base_->size());
    return static_cast<int64_t>(wide / static_cast<unsigned __int128>(n_));
  }

  std::shared_ptr<const SampleSource> base_;
  int64_t n_;
};

// ---- detection ----------------------------------------------------------------------------

// Expands the first "{a..b}" (numeric, zero padding kept when either bound has it) or
// "{x,y,z}" group, recursively, like WebDataset's braceexpand.
void expand_braces(const std::string& pattern, std::vector<std::string>* out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    out->push_back(pattern);
    return;
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) throw bad_input("{}: unmatched '{{' in the shard pattern", pattern);
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open), tail = pattern.substr(close + 1);
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto all_digits = [](const std::string& s) {
      return !s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!all_digits(a) || !all_digits(b)) {
      throw bad_input("{}: expected a numeric range like {{000000..000009}}, found {{{}}}", pattern, body);
    }
    const int64_t lo = std::stoll(a), hi = std::stoll(b);
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const size_t width = padded ? std::max(a.size(), b.size()) : 0;
    if (std::abs(hi - lo) > 10000000) throw bad_input("{}: the range {{{}}} is too large", pattern, body);
    const int64_t step = hi >= lo ? 1 : -1;
    for (int64_t v = lo;; v += step) {
      std::string n = std::to_string(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      expand_braces(head + n + tail, out);
      if (v == hi) break;
    }
    return;
  }
  size_t start = 0;
  for (;;) {
    const size_t comma = body.find(',', start);
    expand_braces(head + body.substr(start, comma - start) + tail, out);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

// Splits at commas outside braces.
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '{') ++depth;
    if (c == '}' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  return parts;
}

bool file_starts_with(const std::string& path, const char* magic, size_t n, size_t at = 0) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string buf(n, '\0');
  const bool ok = std::fseek(f, static_cast<long>(at), SEEK_SET) == 0 && std::fread(buf.data(), 1, n, f) == n;
  std::fclose(f);
  return ok && std::memcmp(buf.data(), magic, n) == 0;
}

constexpr const char* kAccepted =
    "accepted: a packed index (index.crpk or a folder holding it), an LMDB folder (holding data.mdb), a .tar shard, "
    "a comma-separated list or brace pattern of shards (train-{000000..000009}.tar), or an image folder with one "
    "sub-folder per class";

}  // namespace

TarShardIndex index_tar_bytes(const uint8_t* data, uint64_t size, const std::string& shard) {
  return index_tar(data, size, shard);
}

bool decode_tar_sidecar(const std::string& raw, TarShardIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                        std::string* sha256) {
  return decode_tar_index(raw, index, shard_size, mtime_ns, sha256);
}

std::string encode_tar_sidecar(const TarShardIndex& index, uint64_t shard_size, int64_t mtime_ns,
                               const std::string& sha256) {
  return encode_tar_index(index, shard_size, mtime_ns, sha256);
}

PackedIndex parse_packed_index(const std::string& raw, const std::string& ip) {
  const auto* p = reinterpret_cast<const uint8_t*>(raw.data());
  if (raw.size() < pack_format::kHeaderPrefixBytes || !pack_format::has_magic(p, raw.size())) {
    throw bad_input("{}: expected a packed index starting with \"CRPKIDX1\" and a u64 length, found \"{}\" ({} bytes)",
                    ip, printable(p, std::min<size_t>(raw.size(), 8)), raw.size());
  }
  const uint64_t json_len = load_le64(p + 8);
  if (json_len > raw.size() - 16) {
    throw bad_input("{}: the JSON header claims {} bytes but only {} follow", ip, json_len, raw.size() - 16);
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(raw.data() + 16, raw.data() + 16 + json_len);
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("{}: the JSON header does not parse: {}", ip, e.what());
  }
  PackedIndex out;
  int64_t samples = 0;
  try {
    if (!j.is_object()) throw bad_input("{}: the JSON header should be an object", ip);
    const int version = j.at("version").get<int>();
    if (version != pack_format::kVersion) {
      throw bad_input("{}: expected version {}, found {}", ip, pack_format::kVersion, version);
    }
    out.classes = j.at("classes").get<std::vector<std::string>>();
    samples = j.at("samples").get<int64_t>();
    out.shards = j.at("shards").get<std::vector<std::string>>();
    out.align = j.at("align").get<int64_t>();
    out.mode = j.at("mode").get<std::string>();
    if (j.contains("shard_bytes")) out.shard_bytes = j.at("shard_bytes").get<std::vector<uint64_t>>();
    if (j.contains("shard_sha256")) out.shard_sha256 = j.at("shard_sha256").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("{}: the JSON header needs version, classes, samples, shards, align and mode: {}", ip, e.what());
  }
  if (samples < 0) throw bad_input("{}: negative sample count {}", ip, samples);
  if (out.align < 1 || (out.align & (out.align - 1)) != 0) {
    throw bad_input("{}: align should be a power of two, found {}", ip, out.align);
  }
  if ((!out.shard_bytes.empty() && out.shard_bytes.size() != out.shards.size()) ||
      (!out.shard_sha256.empty() && out.shard_sha256.size() != out.shards.size())) {
    throw bad_input("{}: the header lists {} shards but {} sizes and {} checksums", ip, out.shards.size(),
                    out.shard_bytes.size(), out.shard_sha256.size());
  }
  const uint64_t rest = raw.size() - 16 - json_len;
  if (rest % kPackRecordBytes != 0 || rest / kPackRecordBytes != static_cast<uint64_t>(samples)) {
    throw bad_input("{}: the header says {} samples ({} bytes of 24-byte records) but {} bytes follow the JSON header",
                    ip, samples, static_cast<uint64_t>(samples) * kPackRecordBytes, rest);
  }
  for (const auto& name : out.shards) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw bad_input("{}: shard name \"{}\" should be a file name beside the index", ip, name);
    }
  }
  out.records.resize(static_cast<size_t>(samples));
  const uint8_t* r = p + 16 + json_len;
  for (int64_t i = 0; i < samples; ++i, r += kPackRecordBytes) {
    const pack_format::Record rec = pack_format::load_record(r);
    if (rec.shard >= out.shards.size()) {
      throw bad_input("{}: sample {} names shard {} but the index lists {} shards", ip, i, rec.shard, out.shards.size());
    }
    if (!out.shard_bytes.empty() && (rec.offset > out.shard_bytes[rec.shard] ||
                                     rec.size > out.shard_bytes[rec.shard] - rec.offset)) {
      throw bad_input("{}: sample {} lies at bytes [{}, {}) of {} but the shard holds {} bytes (its shard_bytes)", ip, i,
                      rec.offset, rec.offset + rec.size, out.shards[rec.shard], out.shard_bytes[rec.shard]);
    }
    if (rec.offset % static_cast<uint64_t>(out.align) != 0) {
      throw bad_input("{}: sample {} starts at byte {} of {}, not a multiple of align {}", ip, i, rec.offset,
                      out.shards[rec.shard], out.align);
    }
    if (rec.label < -1) throw bad_input("{}: sample {} has label {} (expected >= -1)", ip, i, rec.label);
    out.records[static_cast<size_t>(i)] = rec;
  }
  return out;
}

std::unique_ptr<SampleSource> open_image_folder(const std::string& root) {
  return std::make_unique<ImageFolderSource>(root);
}

std::unique_ptr<SampleSource> open_tar_shards(const std::vector<std::string>& shards) {
  return std::make_unique<TarShardSource>(shards);
}

std::unique_ptr<SampleSource> open_lmdb(const std::string& path) { return std::make_unique<LmdbSource>(path); }

std::unique_ptr<SampleSource> open_packed(const std::string& index_path) {
  return std::make_unique<PackedSource>(index_path);
}

std::unique_ptr<SampleSource> subset_evenly(std::shared_ptr<const SampleSource> base, int64_t n) {
  if (base == nullptr) throw std::logic_error("subset_evenly: no base source");
  if (n < 1 || n > base->size()) {
    throw bad_input("{}: cannot take {} evenly spaced samples of the {} it holds (expected 1 to {})", base->describe(),
                    n, base->size(), base->size());
  }
  return std::make_unique<EvenSubset>(std::move(base), n);
}

std::string RemoteIo::line() const {
  return fmt::format("remote: {} requests ({} retries), {:.1f} MB; shard cache {}: {} downloads, {} hits, {} evictions, "
                     "{} failed checks, {:.1f} of {:.1f} MB used",
                     requests, retries, static_cast<double>(bytes) / 1e6, cache_dir, downloads, hits, evictions,
                     failed_checks, static_cast<double>(cache_used_bytes) / 1e6,
                     static_cast<double>(cache_max_bytes) / 1e6);
}

std::vector<std::string> expand_shard_list(const std::string& list) {
  std::vector<std::string> shards;
  for (const auto& part : split_top_level(list)) {
    if (!part.empty()) expand_braces(part, &shards);
  }
  return shards;
}

std::unique_ptr<SampleSource> open_samples(const std::string& path) {
  if (path.empty()) throw bad_input("empty data path; {}", kAccepted);
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (!exists && (path.find(',') != std::string::npos || path.find('{') != std::string::npos)) {
    return open_tar_shards(expand_shard_list(path));
  }
  if (!exists) throw bad_input("data path {} does not exist; {}", path, kAccepted);
  if (fs::is_directory(path, ec)) {
    if (fs::is_regular_file(path + "/index.crpk", ec)) return open_packed(path);
    if (fs::is_regular_file(path + "/data.mdb", ec)) return open_lmdb(path);
    size_t dirs = 0, files = 0;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      (it->is_directory(ec2) ? dirs : files) += 1;
    }
    if (dirs > 0) return open_image_folder(path);
    if (files == 0) throw bad_input("data folder {} is empty; {}", path, kAccepted);
    throw bad_input("data folder {} holds {} files but no index.crpk, data.mdb or class sub-folders; {}", path, files,
                    kAccepted);
  }
  if (file_starts_with(path, pack_format::kMagic, sizeof pack_format::kMagic)) return open_packed(path);
  const std::string l = lower_ascii(path);
  if (ends_with(l, ".tar") || file_starts_with(path, "ustar", 5, 257)) return open_tar_shards({path});
  if (ends_with(l, ".mdb")) return open_lmdb(path);
  throw bad_input("data path {} is a file that is neither a packed index (no \"CRPKIDX1\" magic), a tar shard nor an "
                  "LMDB data.mdb; {}",
                  path, kAccepted);
}

}  // namespace crucible::data
