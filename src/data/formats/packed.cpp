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
#include "crucible/data/formats/pack_format.h"
#include "crucible/data/formats/shard_index.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

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

std::unique_ptr<SampleSource> open_packed(const std::string& index_path) {
  return std::make_unique<PackedSource>(index_path);
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
          [](const std::string& path, const SourceOptions&) { return open_packed(path); }};
}
}  // namespace format_detail

}  // namespace crucible::data
