// safetensors writer and validating reader (nlohmann::json for the header).
#include "crucible/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"

namespace crucible::io {
namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t expect = checked_nbytes(t.shape.data(), t.shape.size(), t.dtype, path + ": " + t.name);
    if (expect != t.nbytes) {
      throw std::logic_error(fmt::format("write_safetensors {}: tensor {} has {} bytes, shape needs {}", path, t.name,
                                         t.nbytes, expect));
    }
    if (header.contains(t.name)) throw std::logic_error("write_safetensors: duplicate tensor name " + t.name);
    if (dtype_safetensors_name(t.dtype) == nullptr) {
      throw bad_input("{}: tensor '{}': safetensors has no {} type", path, t.name, dtype_name(t.dtype));
    }
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(json.size()) >> (8 * i));
  AtomicFile f(path);
  f.reserve(8 + json.size() + static_cast<uint64_t>(offset));  // a full disk fails before any byte
  f.write(len, 8);
  f.write(json);
  for (const auto& t : tensors) f.write(t.data, t.nbytes);
  f.commit();
}

void write_safetensors(const std::string& path, const std::vector<NamedArray>& arrays,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Array> contiguous;
  contiguous.reserve(arrays.size());
  std::vector<TensorBytes> tensors;
  for (const auto& a : arrays) {
    contiguous.push_back(a.array.contiguous());
    const Array& c = contiguous.back();
    tensors.push_back(TensorBytes{a.name, c.dtype, c.shape, c.data, c.nbytes()});
  }
  write_safetensors(path, tensors, metadata);
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  auto file = MappedFile::open(path);
  return parse(file->data(), file->size(), path, file);
}

Array SafetensorsFile::array(const Entry& e) const {
  Array a;
  a.dtype = e.dtype;
  a.shape = e.shape;
  a.strides = Array::c_strides(e.shape);
  a.data = data(e);
  a.owner = owner_;
  return a;
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& path,
                                       std::shared_ptr<const void> owner) {
  SafetensorsFile out;
  out.path_ = path;
  out.data_ = data;
  out.owner_ = std::move(owner);
  if (size < 8) throw bad_input("{}: truncated safetensors file: {} bytes, the header length alone needs 8", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeader) throw bad_input("{}: byte 0: header length {} exceeds the 100 MB limit", path, n);
  if (8 + n > size) {
    throw bad_input("{}: byte 0: header length {} runs past the end of the {}-byte file", path, n, size);
  }
  nlohmann::json header;
  std::string duplicate;
  try {
    // Duplicate names are an error in the format; nlohmann would keep the last silently.
    std::vector<std::set<std::string>> seen(1);
    auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
      if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
        const std::string k = parsed.get<std::string>();
        if (!seen[0].insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    };
    header = nlohmann::json::parse(data + 8, data + 8 + n, cb);
  } catch (const nlohmann::json::parse_error& e) {
    throw bad_input("{}: byte {}: invalid JSON header: {}", path, 8 + e.byte, e.what());
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("{}: invalid JSON header: {}", path, e.what());
  }
  if (!duplicate.empty()) throw bad_input("{}: tensor name '{}' appears twice in the header", path, duplicate);
  if (!header.is_object()) throw bad_input("{}: byte 8: the header must be a JSON object", path);
  out.buffer_start_ = 8 + n;
  const uint64_t buffer_size = size - out.buffer_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad_input("{}: __metadata__ must be an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw bad_input("{}: __metadata__[\"{}\"] must be a string", path, m.key());
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = path + ": tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      throw bad_input("{}: expected an object with dtype, shape and data_offsets", what);
    }
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string() || !dtype_from_safetensors_name(v["dtype"].get<std::string>(), &e.dtype)) {
      throw bad_input("{}: unknown dtype {}", what, v["dtype"].dump());
    }
    if (!v["shape"].is_array()) throw bad_input("{}: shape must be a list of integers", what);
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad_input("{}: shape must be a list of non-negative integers, found {}", what, d.dump());
      e.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(d.get<uint64_t>(), INT64_MAX)));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw bad_input("{}: data_offsets must be [begin, end]", what);
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    e.nbytes = checked_nbytes(e.shape.data(), e.shape.size(), e.dtype, what);
    if (end < begin || end - begin != e.nbytes) {
      throw bad_input("{}: data_offsets [{}, {}) hold {} bytes, shape {} of {} needs {}", what, begin, end,
                      end >= begin ? end - begin : 0, v["shape"].dump(), dtype_name(e.dtype), e.nbytes);
    }
    if (end > buffer_size) {
      throw bad_input("{}: data ends at buffer byte {} but the buffer has {} bytes (file truncated?)", what, end, buffer_size);
    }
    e.offset = begin;
    out.entries_.push_back(std::move(e));
  }
  std::sort(out.entries_.begin(), out.entries_.end(), [](const Entry& a, const Entry& c) { return a.offset < c.offset; });
  uint64_t expect = 0;
  for (const auto& e : out.entries_) {
    if (e.offset != expect) {
      throw bad_input("{}: tensor '{}' starts at buffer byte {}, expected {} (gap or overlap)", path, e.name, e.offset, expect);
    }
    expect = e.offset + e.nbytes;
  }
  if (expect != buffer_size) {
    throw bad_input("{}: the tensors cover {} buffer bytes but the file holds {} (trailing bytes)", path, expect, buffer_size);
  }
  return out;
}

const SafetensorsFile::Entry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace crucible::io
