// TensorBoard event files (see tensorboard.h): CRC-32C, TFRecord framing, the protobuf fields of
// Event / Summary / HistogramProto / TensorProto encoded by hand, and the sink.
#include "crucible/obs/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>


#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::obs {
namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}

// --- protobuf wire format (https://protobuf.dev/programming-guides/encoding/) ---
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire); }
void put_double(std::string& out, int field, double v) {
  put_key(out, field, 1);
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  append_le64(out, bits);
}
void put_float(std::string& out, int field, float v) {
  put_key(out, field, 5);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  append_le32(out, bits);
}
void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_packed_doubles(std::string& out, int field, const std::vector<double>& v) {
  std::string body;
  for (double d : v) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    append_le64(body, bits);
  }
  put_bytes(out, field, body);
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) put_int(e, 2, step);
  return e;
}
// Summary { repeated Value value = 1; }
std::string summary_event(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  put_bytes(summary, 1, value);
  std::string e = event(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string frame(const std::string& data) {
  std::string rec;
  append_le64(rec, data.size());
  const uint32_t len_crc = masked_crc32c(rec.data(), 8);
  append_le32(rec, len_crc);
  rec += data;
  append_le32(rec, masked_crc32c(data.data(), data.size()));
  return rec;
}

bool is_event_file(const fs::path& p) { return p.filename().string().rfind("events.out.tfevents.", 0) == 0; }

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw runtime_error("cannot create TensorBoard folder {}: {}", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  // TensorBoard reads the files of a folder in name order: the time leads, a counter breaks ties.
  static std::atomic<int> counter{0};
  const double t = now_seconds();
  for (;;) {
    path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(t), host,
                                         static_cast<int>(getpid()), counter++))
                .string();
    if (!fs::exists(path_)) break;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error("cannot create {}: {}", path_, errno_text(errno));
  std::string e = event(t, 0);
  put_bytes(e, 3, "brain.Event:2");
  write_event(e);
  flush();
}

EventWriter::~EventWriter() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (const Error&) {
    // a full disk at the end: the file keeps the records of the last flush, whole
  }
  ::close(fd_);
}

void EventWriter::write_event(const std::string& e) { pending_ += frame(e); }

void EventWriter::flush() {
  std::string records;
  records.swap(pending_);  // dropped even when the append fails: the file then ends at a whole record
  if (!records.empty()) append_whole(fd_, path_, records);
}

// Summary.Value { string tag = 1; float simple_value = 2; HistogramProto histo = 5;
//                 TensorProto tensor = 8; SummaryMetadata metadata = 9; }
void EventWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, static_cast<float>(value));
  write_event(summary_event(wall_time, step, v));
}

void EventWriter::text(const std::string& tag, int64_t step, const std::string& text, double wall_time) {
  // SummaryMetadata { PluginData plugin_data = 1 { string plugin_name = 1; } }
  std::string plugin, metadata;
  put_bytes(plugin, 1, "text");
  put_bytes(metadata, 1, plugin);
  // TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2 (a
  // scalar: no dims); repeated bytes string_val = 8; }
  std::string tensor;
  put_int(tensor, 1, 7);
  put_bytes(tensor, 2, "");
  put_bytes(tensor, 8, text);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, metadata);
  write_event(summary_event(wall_time, step, v));
}

// HistogramProto { double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5;
//                  repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed]; }
void EventWriter::histogram(const std::string& tag, int64_t step, const Histogram& h, double wall_time) {
  std::string histo;
  put_double(histo, 1, h.min);
  put_double(histo, 2, h.max);
  put_double(histo, 3, h.num);
  put_double(histo, 4, h.sum);
  put_double(histo, 5, h.sum_squares);
  put_packed_doubles(histo, 6, h.limits);
  put_packed_doubles(histo, 7, h.counts);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 5, histo);
  write_event(summary_event(wall_time, step, v));
}

// --- HParams (tensorboard/plugins/hparams/plugin_data.proto, api.proto; google/protobuf/struct.proto) ---
namespace {

// A summary value that carries only plugin metadata: SummaryMetadata { plugin_data = 1 {
// plugin_name = 1 "hparams"; content = 2 HParamsPluginData { version = 1 (0); one of
// experiment = 2, session_start_info = 3, session_end_info = 4 } } }.
std::string hparams_value(const std::string& tag, int field, const std::string& message) {
  std::string data, plugin, metadata, v;
  put_bytes(data, field, message);  // version 0 is the default: not written
  put_bytes(plugin, 1, "hparams");
  put_bytes(plugin, 2, data);
  put_bytes(metadata, 1, plugin);
  put_bytes(v, 1, tag);
  put_bytes(v, 9, metadata);
  return v;
}

// google.protobuf.Value { number_value = 2; string_value = 3; bool_value = 4; } from TOML text;
// `type` gets api.proto's DataType (STRING 1, BOOL 2, FLOAT64 3).
std::string toml_to_value(const std::string& toml, int* type) {
  std::string v;
  if (toml == "true" || toml == "false") {
    put_int(v, 4, toml == "true" ? 1 : 0);
    *type = 2;
    return v;
  }
  if (toml.size() >= 2 && toml.front() == '"' && toml.back() == '"') {
    put_bytes(v, 3, toml.substr(1, toml.size() - 2));
    *type = 1;
    return v;
  }
  char* end = nullptr;
  const double d = std::strtod(toml.c_str(), &end);
  if (!toml.empty() && end == toml.c_str() + toml.size()) {
    put_double(v, 2, d);
    *type = 3;
    return v;
  }
  put_bytes(v, 3, toml);  // lists and anything else: as written
  *type = 1;
  return v;
}

}  // namespace

void EventWriter::hparams_start(const std::vector<std::pair<std::string, std::string>>& hparams,
                                const std::vector<std::string>& metric_tags, int64_t step, double wall_time) {
  // Experiment { repeated HParamInfo hparam_infos = 4 { name = 1; type = 4; }
  //              repeated MetricInfo metric_infos = 5 { MetricName name = 1 { group = 1; tag = 2; };
  //                                                     dataset_type = 5 (VALIDATION = 2); } }
  // SessionStartInfo { map<string, Value> hparams = 1 (entries { key = 1; value = 2; });
  //                    double start_time_secs = 5; }
  std::string experiment, start;
  for (const auto& [name, toml] : hparams) {
    int type = 0;
    const std::string value = toml_to_value(toml, &type);
    std::string info, entry;
    put_bytes(info, 1, name);
    put_int(info, 4, type);
    put_bytes(experiment, 4, info);
    put_bytes(entry, 1, name);
    put_bytes(entry, 2, value);
    put_bytes(start, 1, entry);
  }
  for (const std::string& tag : metric_tags) {
    std::string metric_name, info;
    put_bytes(metric_name, 2, tag);
    put_bytes(info, 1, metric_name);
    put_int(info, 5, 2);
    put_bytes(experiment, 5, info);
  }
  put_double(start, 5, wall_time);
  write_event(summary_event(wall_time, step, hparams_value("_hparams_/experiment", 2, experiment)));
  write_event(summary_event(wall_time, step, hparams_value("_hparams_/session_start_info", 3, start)));
}

void EventWriter::hparams_end(int64_t step, double wall_time) {
  // SessionEndInfo { Status status = 1 (SUCCESS = 1); double end_time_secs = 2; }
  std::string end;
  put_int(end, 1, 1);
  put_double(end, 2, wall_time);
  write_event(summary_event(wall_time, step, hparams_value("_hparams_/session_end_info", 4, end)));
}

std::vector<std::string> read_event_records(const std::string& path, bool* torn) {
  const std::string bytes = read_file(path);
  std::vector<std::string> records;
  size_t off = 0;
  if (torn != nullptr) *torn = false;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  while (off < bytes.size()) {
    if (bytes.size() - off < 12) break;
    const uint64_t len = load_le64(p + off);
    if (load_le32(p + off + 8) != masked_crc32c(p + off, 8)) {
      throw bad_input("{}: byte {}: the length's CRC-32C does not match (not an event file, or damaged)", path, off);
    }
    if (len > bytes.size() - off - 12 || bytes.size() - off - 12 - len < 4) break;
    const uint8_t* data = p + off + 12;
    if (load_le32(data + len) != masked_crc32c(data, len)) {
      throw bad_input("{}: byte {}: the record's CRC-32C does not match (damaged event file)", path, off);
    }
    records.emplace_back(reinterpret_cast<const char*>(data), len);
    off += 12 + len + 4;
  }
  if (off < bytes.size() && torn != nullptr) *torn = true;
  return records;
}

int64_t event_step(const std::string& e) {
  const auto* p = reinterpret_cast<const uint8_t*>(e.data());
  size_t i = 0;
  const size_t n = e.size();
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; i < n && shift < 64; shift += 7) {
      const uint8_t b = p[i++];
      v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < n) {
    uint64_t key;
    if (!varint(key)) break;
    const int field = static_cast<int>(key >> 3);
    const int wire = static_cast<int>(key & 7);
    uint64_t v = 0;
    if (wire == 0) {
      if (!varint(v)) break;
      if (field == 2) return static_cast<int64_t>(v);
    } else if (wire == 1) {
      i += 8;
    } else if (wire == 5) {
      i += 4;
    } else if (wire == 2) {
      if (!varint(v)) break;
      i += v;
    } else {
      break;
    }
  }
  return 0;
}

void truncate_events(const std::string& dir, int64_t last_step) {
  if (!fs::is_directory(dir)) return;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || !is_event_file(entry.path())) continue;
    const std::string path = entry.path().string();
    std::string kept;
    size_t events = 0;
    for (const std::string& e : read_event_records(path)) {
      // The version event has step 0 and no summary; keep every event up to the checkpoint.
      if (event_step(e) > last_step) continue;
      kept += frame(e);
      ++events;
    }
    if (events <= 1) {
      fs::remove(path);
    } else {
      write_file_atomic(path, kept);
    }
  }
}

TensorBoardSink::TensorBoardSink(const std::string& dir, int64_t start_step, const std::string& config_toml,
                                 const std::vector<std::pair<std::string, std::string>>& hparams)
    : writer_(dir) {
  const double t = now_seconds();
  // Markdown: a fenced block keeps the TOML as it is.
  writer_.text("config", start_step, "```toml\n" + config_toml + "```\n", t);
  writer_.hparams_start(hparams, {"eval/test_acc", "eval/test_top5", "eval/test_loss"}, start_step, t);
  writer_.flush();
}

void TensorBoardSink::finish(int64_t step) {
  writer_.hparams_end(step, now_seconds());
  writer_.flush();
}

void TensorBoardSink::write(const nlohmann::json& record) {
  const std::string type = record.value("type", std::string("train"));
  const int64_t step = record.value("step", int64_t{0});
  const double t = now_seconds();
  for (const auto& [key, value] : record.items()) {
    if (key == "type" || key == "step") continue;
    if (value.is_number()) writer_.scalar(type + "/" + key, step, value.get<double>(), t);
    if (!value.is_object()) continue;
    for (const auto& [sub, v] : value.items()) {  // "breakdown": {"forward": 0.41, …} → train/breakdown/forward
      if (v.is_number()) writer_.scalar(type + "/" + key + "/" + sub, step, v.get<double>(), t);
    }
  }
  writer_.flush();
}

void TensorBoardSink::histograms(int64_t step, const NamedHistograms& named) {
  const double t = now_seconds();
  for (const auto& [tag, h] : named) writer_.histogram(tag, step, h, t);
  writer_.flush();
}

}  // namespace crucible::obs
