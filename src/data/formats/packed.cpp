// crucible's packed shards, read (sample_source.h: open_packed; shard_index.h: the index;
// pack.h writes them).
#include "crucible/data/formats/sample_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/data/formats/json_target.h"
#include "crucible/data/formats/pack_format.h"
#include "crucible/data/formats/shard_index.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

class PackedSource final : public SampleSource {
 public:
  PackedSource(std::string index_path, const SourceOptions& options)
      : index_path_(std::move(index_path)), policy_(options.boxes) {
    std::error_code ec;
    if (fs::is_directory(index_path_, ec)) index_path_ += "/index.crpk";
    const std::string& ip = index_path_;
    PackedIndex index = parse_packed_index(read_file(ip), ip);  // bad_input when missing or damaged
    classes_ = std::move(index.classes);
    shard_names_ = std::move(index.shards);
    align_ = index.align;
    mode_ = std::move(index.mode);
    boxes_ = index.boxes;
    category_ids_ = std::move(index.category_ids);
    box_counts_ = index.box_counts;
    exif_orientation_ = index.exif_orientation;
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
    records_ = std::move(index.records);
    for (size_t i = 0; i < records_.size(); ++i) {
      const pack_format::Record& rec = records_[i];
      const uint64_t shard_size = shards_[rec.shard]->size();
      const uint64_t extent = uint64_t{rec.size} + rec.target_size;
      if (rec.offset > shard_size || extent > shard_size - rec.offset) {
        throw bad_input("{}: sample {} lies at bytes [{}, {}) of {} but the shard holds {} bytes", ip, i, rec.offset,
                        rec.offset + extent, shard_paths_[rec.shard], shard_size);
      }
    }
  }

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

  // Names "<dst>/<shard>#<index>" with the sample's index in the whole packed set.
  EncodedSample get(int64_t index) const override {
    const pack_format::Record& r = records_.at(static_cast<size_t>(index));
    EncodedSample s = view_of(shards_[r.shard], r.offset, r.size, r.label, fmt::format("{}#{}", shard_paths_[r.shard], index));
    if (boxes_) {
      attach_packed_target(&s, r, shards_[r.shard]->data() + r.offset + r.size, s.name, policy_,
                           static_cast<int64_t>(classes_.size()));
    }
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<int64_t> shard_counts() const override { return contiguous_shard_counts(records_, shards_.size()); }
  std::string describe() const override {
    return fmt::format("packed {}: {} samples in {} shards (mode {}, align {}){}", index_path_, records_.size(),
                       shards_.size(), mode_, align_, boxes_ ? ", detection targets: " + box_counts_.line() : "");
  }
  bool has_boxes() const override { return boxes_; }
  std::vector<int64_t> category_ids() const override { return category_ids_; }
  bool image_size(int64_t index, int* width, int* height) const override {
    if (!boxes_) return false;
    const pack_format::Record& r = records_.at(static_cast<size_t>(index));
    *width = static_cast<int>(r.width);
    *height = static_cast<int>(r.height);
    return true;
  }
  BoxCounts box_counts() const override { return box_counts_; }
  // A detection set's boxes are in the frame its packer decoded the images in.
  bool exif_orientation() const override { return exif_orientation_; }

 private:
  std::string index_path_;
  BoxPolicy policy_;
  bool boxes_ = false;
  std::vector<int64_t> category_ids_;
  BoxCounts box_counts_;
  bool exif_orientation_ = true;
  std::vector<std::string> classes_;
  std::vector<std::string> shard_names_;
  std::vector<std::string> shard_paths_;
  std::vector<std::shared_ptr<const MappedFile>> shards_;
  std::vector<pack_format::Record> records_;
  int64_t align_ = 0;
  std::string mode_;
};

}  // namespace

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
    if (version != pack_format::kVersion && version != pack_format::kVersionBoxes) {
      throw bad_input("{}: expected version {} (classification) or {} (detection), found {}", ip, pack_format::kVersion,
                      pack_format::kVersionBoxes, version);
    }
    out.boxes = version == pack_format::kVersionBoxes;
    if (out.boxes) {
      const std::string target = j.at("target").get<std::string>();
      if (target != "boxes") throw bad_input("{}: expected \"target\": \"boxes\" in a version 2 index, found \"{}\"", ip, target);
      out.exif_orientation = j.value("exif_orientation", false);
      if (j.contains("category_ids")) out.category_ids = j.at("category_ids").get<std::vector<int64_t>>();
      if (j.contains("box_counts")) {
        const auto& c = j.at("box_counts");
        out.box_counts.kept = c.at("kept").get<int64_t>();
        out.box_counts.clamped = c.at("clamped").get<int64_t>();
        out.box_counts.dropped = c.at("dropped").get<int64_t>();
      }
    }
    out.classes = j.at("classes").get<std::vector<std::string>>();
    samples = j.at("samples").get<int64_t>();
    out.shards = j.at("shards").get<std::vector<std::string>>();
    out.align = j.at("align").get<int64_t>();
    out.mode = j.at("mode").get<std::string>();
    if (j.contains("shard_bytes")) out.shard_bytes = j.at("shard_bytes").get<std::vector<uint64_t>>();
    if (j.contains("shard_sha256")) out.shard_sha256 = j.at("shard_sha256").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("{}: the JSON header needs version, classes, samples, shards, align and mode (and a detection set "
                    "target, category_ids and box_counts of the right types): {}",
                    ip, e.what());
  }
  if (!out.category_ids.empty() && out.category_ids.size() != out.classes.size()) {
    throw bad_input("{}: {} category_ids for {} classes", ip, out.category_ids.size(), out.classes.size());
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
  const size_t record_bytes = pack_format::record_bytes(out.boxes);
  if (rest % record_bytes != 0 || rest / record_bytes != static_cast<uint64_t>(samples)) {
    throw bad_input("{}: the header says {} samples ({} bytes of {}-byte records) but {} bytes follow the JSON header",
                    ip, samples, static_cast<uint64_t>(samples) * record_bytes, record_bytes, rest);
  }
  for (const auto& name : out.shards) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw bad_input("{}: shard name \"{}\" should be a file name beside the index", ip, name);
    }
  }
  out.records.resize(static_cast<size_t>(samples));
  const uint8_t* r = p + 16 + json_len;
  for (int64_t i = 0; i < samples; ++i, r += record_bytes) {
    const pack_format::Record rec = pack_format::load_record(r, out.boxes);
    if (rec.shard >= out.shards.size()) {
      throw bad_input("{}: sample {} names shard {} but the index lists {} shards", ip, i, rec.shard, out.shards.size());
    }
    const uint64_t extent = uint64_t{rec.size} + rec.target_size;  // the image, then a detection sample's target
    if (!out.shard_bytes.empty() && (rec.offset > out.shard_bytes[rec.shard] ||
                                     extent > out.shard_bytes[rec.shard] - rec.offset)) {
      throw bad_input("{}: sample {} lies at bytes [{}, {}) of {} but the shard holds {} bytes (its shard_bytes)", ip, i,
                      rec.offset, rec.offset + extent, out.shards[rec.shard], out.shard_bytes[rec.shard]);
    }
    if (out.boxes && (rec.target_size == 0 || rec.width == 0 || rec.height == 0)) {
      throw bad_input("{}: detection sample {} has a target of {} bytes and an image of {}x{} pixels (expected a "
                      "target and a size of at least 1x1)",
                      ip, i, rec.target_size, rec.width, rec.height);
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

void attach_packed_target(EncodedSample* sample, const pack_format::Record& record, const uint8_t* target,
                          const std::string& where, const BoxPolicy& policy, int64_t classes) {
  BoxCounts counts;  // the pack counted what its source's policy did; a box still bad here is a damaged set
  JsonTarget t = parse_json_target(target, record.target_size, where + " (its JSON target)", policy,
                                   static_cast<int>(record.width), static_cast<int>(record.height), classes, &counts);
  if ((t.width != 0 && t.width != static_cast<int>(record.width)) ||
      (t.height != 0 && t.height != static_cast<int>(record.height))) {
    throw bad_input("{}: its JSON target says {}x{} pixels but the index records {}x{}", where, t.width, t.height,
                    record.width, record.height);
  }
  sample->boxes = std::move(t.boxes);
  sample->image_id = t.image_id;
  sample->width = static_cast<int>(record.width);
  sample->height = static_cast<int>(record.height);
}

std::unique_ptr<SampleSource> open_packed(const std::string& index_path, const SourceOptions& options) {
  return std::make_unique<PackedSource>(index_path, options);
}

namespace format_detail {
// A folder holding index.crpk, or a file starting with the index's magic.
SampleFormat packed_format() {
  return {"packed", "a packed index (index.crpk or a folder holding it)",
          [](const std::string& path, bool, bool is_dir) {
            std::error_code ec;
            return is_dir ? fs::is_regular_file(path + "/index.crpk", ec)
                          : file_starts_with(path, pack_format::kMagic, sizeof pack_format::kMagic);
          },
          [](const std::string& path, const SourceOptions& options) { return open_packed(path, options); }};
}
}  // namespace format_detail

}  // namespace crucible::data
