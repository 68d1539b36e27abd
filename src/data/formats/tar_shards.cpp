// WebDataset tar shards with a validated "<shard>.idx" offset index (sample_source.h:
// open_tar_shards; shard_index.h: the index and its sidecar).
#include "crucible/data/formats/sample_source.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/sha256.h"
#include "crucible/data/formats/json_target.h"
#include "crucible/data/formats/shard_index.h"
#include "crucible/data/image/decode.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

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

bool is_target_field(const std::string& field) { return field == "json"; }

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
  bool cur_has_image = false, cur_has_label = false, cur_has_target = false;
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
            cur_has_image = cur_has_label = cur_has_target = false;
          }
          if (!cur_has_image && is_image_field(field)) {
            cur.offset = data_off;
            cur.size = member_size;
            cur_has_image = true;
          } else if (!cur_has_label && is_label_field(field)) {
            cur.label = parse_label(body, member_size, shard, name, off);
            cur_has_label = true;
          } else if (!cur_has_target && is_target_field(field) && is_json_target(body, member_size)) {
            // A .json member with "boxes" is the sample's detection target; any other is metadata.
            cur.target_offset = data_off;
            cur.target_size = member_size;
            cur_has_target = true;
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

// "<shard>.idx": "CRTARIX3", u64 shard size, i64 shard mtime (ns), the shard's SHA-256 (32 raw
// bytes), u64 skipped, u64 count, then count × {u64 offset, u64 size, i64 label, u64 target
// offset, u64 target size, u32 key length, key bytes}, then u32 CRC-32 of all the bytes before
// it. Everything little-endian. Still read: "CRTARIX2", the same without the targets' places
// (written before issue 47), and "CRTARIX1", without the SHA-256 too.
constexpr char kTarIndexMagicV1[8] = {'C', 'R', 'T', 'A', 'R', 'I', 'X', '1'};
constexpr char kTarIndexMagicV2[8] = {'C', 'R', 'T', 'A', 'R', 'I', 'X', '2'};
constexpr char kTarIndexMagic[8] = {'C', 'R', 'T', 'A', 'R', 'I', 'X', '3'};

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
  std::string out(sha256.empty() ? kTarIndexMagicV1 : kTarIndexMagic, 8);  // the old format has no targets
  append_le64(out, shard_size);
  append_le64(out, static_cast<uint64_t>(mtime_ns));
  out += raw_sha;
  append_le64(out, index.skipped);
  append_le64(out, index.samples.size());
  for (const auto& s : index.samples) {
    append_le64(out, s.offset);
    append_le64(out, s.size);
    append_le64(out, static_cast<uint64_t>(s.label));
    if (!sha256.empty()) {
      append_le64(out, s.target_offset);
      append_le64(out, s.target_size);
    }
    append_le32(out, static_cast<uint32_t>(s.key.size()));
    out += s.key;
  }
  append_le32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size()))));
  return out;
}

// A sidecar's index, the size and mtime of the shard it describes and its SHA-256 (hex; empty
// in the old format); false when damaged.
bool decode_tar_index(const std::string& raw, TarIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                      std::string* sha256, bool* has_targets = nullptr) {
  const auto* p = reinterpret_cast<const uint8_t*>(raw.data());
  const size_t n = raw.size();
  if (n < 8) return false;
  const bool v1 = std::memcmp(p, kTarIndexMagicV1, 8) == 0;
  const bool v2 = std::memcmp(p, kTarIndexMagicV2, 8) == 0;
  if (!v1 && !v2 && std::memcmp(p, kTarIndexMagic, 8) != 0) return false;
  const size_t record = v1 || v2 ? 28 : 44;  // the fixed part of a record
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
  if (count > (end - at) / record) return false;
  out.samples.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    if (end - at < record) return false;
    TarSample s;
    s.offset = load_le64(p + at);
    s.size = load_le64(p + at + 8);
    s.label = static_cast<int64_t>(load_le64(p + at + 16));
    if (record == 44) {
      s.target_offset = load_le64(p + at + 24);
      s.target_size = load_le64(p + at + 32);
    }
    const uint32_t key_len = load_le32(p + at + record - 4);
    at += record;
    if (key_len > end - at || s.offset > size || s.size > size - s.offset || s.label < -1) return false;
    if (s.target_offset > size || s.target_size > size - s.target_offset) return false;
    s.key.assign(reinterpret_cast<const char*>(p + at), key_len);
    at += key_len;
    out.samples.push_back(std::move(s));
  }
  if (at != end) return false;
  *index = std::move(out);
  *shard_size = size;
  *mtime_ns = static_cast<int64_t>(load_le64(p + 16));
  if (sha256 != nullptr) *sha256 = v1 ? "" : to_hex(p + 24, 32);
  if (has_targets != nullptr) *has_targets = record == 44;
  return true;
}

// The sidecar index when it exists, is intact and matches the shard, with the shard's SHA-256
// (empty from an old sidecar); otherwise false.
bool read_tar_index(const std::string& path, uint64_t shard_size, int64_t mtime_ns, TarIndex* index,
                    std::string* sha256, bool* has_targets) {
  std::string raw;
  try {
    raw = read_file(path);
  } catch (const Error&) {
    return false;
  }
  TarIndex out;
  uint64_t size = 0;
  int64_t mtime = 0;
  if (!decode_tar_index(raw, &out, &size, &mtime, sha256, has_targets) || size != shard_size || mtime != mtime_ns) {
    return false;
  }
  *index = std::move(out);
  return true;
}

class TarShardSource final : public SampleSource {
 public:
  TarShardSource(const std::vector<std::string>& shards, const SourceOptions& options) : names_(shards) {
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
      bool write = false, has_targets = false;
      if (static_cast<uint64_t>(st.st_size) == file->size() &&
          read_tar_index(idx_path, file->size(), mtime_ns, &index, &sha256, &has_targets)) {
        ++indexes_read_;
        const fs::path folder = fs::path(idx_path).parent_path();
        const bool writable = ::access(folder.empty() ? "." : folder.c_str(), W_OK) == 0;
        // An index from before the targets' places were recorded: the headers walked again for
        // them (the samples are the same), and rewritten where the folder takes writes. One from
        // before the hash was recorded is given it too (a remote copy of the shard is verified by it).
        if (!has_targets) {
          index = index_tar(file->data(), file->size(), shard);
          write = writable;
        }
        hashes_added_ += sha256.empty() && writable;
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
        records_.push_back({static_cast<uint32_t>(i), s.offset, s.size, s.label, std::move(s.key), s.target_offset,
                            s.target_size});
      }
      files_.push_back(std::move(file));
    }
    if (std::any_of(records_.begin(), records_.end(), [](const Record& r) { return r.target_size > 0; })) {
      max_label = read_targets(options.boxes);
    }
    classes_ = numbered_classes(max_label);
  }

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

  EncodedSample get(int64_t index) const override {
    const Record& r = records_.at(static_cast<size_t>(index));
    EncodedSample s = view_of(files_[r.shard], r.offset, r.size, r.label, names_[r.shard] + ":" + r.key);
    if (!targets_.empty()) {
      const Target& t = targets_[static_cast<size_t>(index)];
      s.boxes = t.boxes;
      s.image_id = t.image_id;
      s.width = t.width;
      s.height = t.height;
    }
    return s;
  }
  bool has_boxes() const override { return !targets_.empty(); }
  bool image_size(int64_t index, int* width, int* height) const override {
    if (targets_.empty()) return false;
    *width = targets_.at(static_cast<size_t>(index)).width;
    *height = targets_.at(static_cast<size_t>(index)).height;
    return true;
  }
  BoxCounts box_counts() const override { return counts_; }
  // A detection target's boxes are in the stored pixels' frame, as COCO's are (a target written
  // from torchvision's COCO reading, through PIL, which does not rotate).
  bool exif_orientation() const override { return targets_.empty(); }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<int64_t> shard_counts() const override { return contiguous_shard_counts(records_, files_.size()); }

  std::string describe() const override {
    return fmt::format("{} tar shard{} ({}{}): {} samples, {} skipped without an image; offset indexes: {} read from "
                       ".idx, {} built{}{}",
                       names_.size(), names_.size() == 1 ? "" : "s", names_.front(), names_.size() > 1 ? ", ..." : "",
                       records_.size(), skipped_, indexes_read_, indexes_built_,
                       hashes_added_ > 0 ? fmt::format(", {} given the shard's SHA-256", hashes_added_) : "",
                       targets_.empty() ? "" : "; detection targets: " + counts_.line());
  }

 private:
  struct Record {
    uint32_t shard;
    uint64_t offset;
    uint64_t size;
    int64_t label;
    std::string key;
    uint64_t target_offset, target_size;
  };
  struct Target {
    std::shared_ptr<const Boxes> boxes;
    int64_t image_id = -1;
    int width = 0, height = 0;
  };

  // Detection: every sample's JSON target, parsed once here (its size from the JSON, else from
  // the image's header) under `policy`; returns the largest label. Every sample must carry one.
  int64_t read_targets(const BoxPolicy& policy) {
    int64_t max_label = -1;
    targets_.resize(records_.size());
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      const std::string where = names_[r.shard] + ":" + r.key;
      if (r.target_size == 0) {
        throw bad_input("{}: the sample has no .json target, but other samples of the set have one (a detection set "
                        "gives every image a target; a background image has \"boxes\": [])",
                        where);
      }
      const uint8_t* base = files_[r.shard]->data();
      BoxCounts first;
      JsonTarget t = parse_json_target(base + r.target_offset, r.target_size, where + ".json", policy, 0, 0, 0, &first);
      if (t.width > 0 && t.height > 0) {
        counts_.kept += first.kept, counts_.clamped += first.clamped, counts_.dropped += first.dropped;
      } else {  // the size from the image's header, then the boxes checked against it
        const ImageInfo info = probe_image(base + r.offset, r.size, where, /*exif_orientation=*/false);
        t = parse_json_target(base + r.target_offset, r.target_size, where + ".json", policy, info.width, info.height, 0,
                              &counts_);
        t.width = info.width;
        t.height = info.height;
      }
      for (const int64_t l : t.boxes->labels) max_label = std::max(max_label, l);
      targets_[i] = {std::move(t.boxes), t.image_id, t.width, t.height};
    }
    return max_label;
  }
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<Record> records_;
  std::vector<std::string> classes_;
  uint64_t skipped_ = 0;
  int indexes_read_ = 0;
  int indexes_built_ = 0;
  int hashes_added_ = 0;  // old indexes rewritten with the shard's SHA-256
  std::vector<Target> targets_;  // detection: one per sample; empty for a classification set
  BoxCounts counts_;
};

}  // namespace

TarShardIndex index_tar_bytes(const uint8_t* data, uint64_t size, const std::string& shard) {
  return index_tar(data, size, shard);
}

bool decode_tar_sidecar(const std::string& raw, TarShardIndex* index, uint64_t* shard_size, int64_t* mtime_ns,
                        std::string* sha256, bool* has_targets) {
  return decode_tar_index(raw, index, shard_size, mtime_ns, sha256, has_targets);
}

std::string encode_tar_sidecar(const TarShardIndex& index, uint64_t shard_size, int64_t mtime_ns,
                               const std::string& sha256) {
  return encode_tar_index(index, shard_size, mtime_ns, sha256);
}

std::unique_ptr<SampleSource> open_tar_shards(const std::vector<std::string>& shards, const SourceOptions& options) {
  return std::make_unique<TarShardSource>(shards, options);
}

namespace format_detail {
// A .tar file (or one with ustar's magic), or a list or brace pattern of shards (which need not
// exist as a path: "train-{000000..000009}.tar").
SampleFormat tar_shard_format() {
  return {"tar", "a .tar shard, a comma-separated list or brace pattern of shards (train-{000000..000009}.tar)",
          [](const std::string& path, bool exists, bool is_dir) {
            if (!exists) return path.find(',') != std::string::npos || path.find('{') != std::string::npos;
            return !is_dir && (ends_with(lower_ascii(path), ".tar") || file_starts_with(path, "ustar", 5, 257));
          },
          [](const std::string& path, const SourceOptions& options) {
            std::error_code ec;
            return fs::exists(path, ec) ? open_tar_shards({path}, options)
                                        : open_tar_shards(expand_shard_list(path), options);
          }};
}
}  // namespace format_detail

}  // namespace crucible::data
