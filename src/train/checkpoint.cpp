// Checkpoint files on safetensors with a SHA-256 over names, dtypes, shapes, bytes and meta.
#include "crucible/train/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/log.h"
#include "crucible/core/sha256.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor.h"

namespace crucible::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kChecksumKey = "crucible.sha256";
constexpr const char* kFormatKey = "crucible.format";
constexpr const char* kFormat = "checkpoint-1";

// Digest over everything in the file except the digest itself, in a canonical order.
std::string digest(const std::vector<io::TensorBytes>& tensors, const std::map<std::string, std::string>& meta) {
  std::vector<const io::TensorBytes*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  Sha256 h;
  for (const auto& [k, v] : meta) {
    if (k == kChecksumKey) continue;
    h.update(fmt::format("m{}:{}={}:{}\n", k.size(), k, v.size(), v));
  }
  for (const auto* t : sorted) {
    h.update(fmt::format("t{}:{}:{}:{}:{}\n", t->name.size(), t->name, io::dtype_name(t->dtype),
                         fmt::join(t->shape, ","), t->nbytes));
    h.update(t->data, t->nbytes);
  }
  return h.hex_digest();
}

// "ckpt-000123.safetensors" → 123, or -1.
int64_t step_of(const std::string& file_name) {
  if (file_name.rfind("ckpt-", 0) != 0) return -1;
  const auto dot = file_name.find(".safetensors");
  if (dot == std::string::npos || dot + 12 != file_name.size()) return -1;
  const std::string digits = file_name.substr(5, dot - 5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

}  // namespace

const at::Tensor* CheckpointData::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

int64_t CheckpointData::meta_int(const std::string& key, const std::string& source) const {
  auto it = meta.find(key);
  if (it == meta.end()) throw bad_input("{}: checkpoint metadata lacks '{}'", source, key);
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw bad_input("{}: checkpoint metadata '{}' = \"{}\" is not an integer", source, key, it->second);
  }
}

double CheckpointData::meta_double(const std::string& key, const std::string& source) const {
  auto it = meta.find(key);
  if (it == meta.end()) throw bad_input("{}: checkpoint metadata lacks '{}'", source, key);
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    throw bad_input("{}: checkpoint metadata '{}' = \"{}\" is not a number", source, key, it->second);
  }
}

void write_checkpoint(const std::string& path, const CheckpointData& data) {
  std::vector<at::Tensor> keep(data.tensors.size());
  std::vector<io::TensorBytes> bytes;
  bytes.reserve(data.tensors.size());
  for (size_t i = 0; i < data.tensors.size(); ++i) {
    bytes.push_back(io::tensor_bytes(data.tensors[i].name, data.tensors[i].tensor.detach(), keep[i]));
  }
  std::map<std::string, std::string> meta = data.meta;
  meta[kFormatKey] = kFormat;
  meta[kChecksumKey] = digest(bytes, meta);
  io::write_safetensors(path, bytes, meta);
}

CheckpointData read_checkpoint(const std::string& path) {
  io::SafetensorsFile file = io::SafetensorsFile::read(path);
  auto meta = file.metadata();
  auto fmt_it = meta.find(kFormatKey);
  if (fmt_it == meta.end() || fmt_it->second != kFormat) {
    throw bad_input("{}: not a crucible checkpoint (metadata '{}' is {}, expected \"{}\")", path, kFormatKey,
                    fmt_it == meta.end() ? "missing" : "\"" + fmt_it->second + "\"", kFormat);
  }
  auto sum_it = meta.find(kChecksumKey);
  if (sum_it == meta.end()) throw bad_input("{}: checkpoint has no checksum ('{}')", path, kChecksumKey);
  std::vector<io::TensorBytes> bytes;
  for (const auto& e : file.entries()) {
    bytes.push_back(io::TensorBytes{e.name, e.dtype, e.shape, file.data(e), e.nbytes});
  }
  const std::string actual = digest(bytes, meta);
  if (actual != sum_it->second) {
    throw bad_input("{}: checksum mismatch: stored sha256 {}, computed {} (file corrupt)", path, sum_it->second, actual);
  }
  CheckpointData out;
  meta.erase(kChecksumKey);
  meta.erase(kFormatKey);
  out.meta = std::move(meta);
  for (const auto& e : file.entries()) out.tensors.push_back({e.name, io::to_tensor(file.array(e), path)});
  return out;
}

CheckpointManager::CheckpointManager(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  if (keep_ < 1) throw bad_input("checkpoint.keep must be >= 1, found {}", keep_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw runtime_error("cannot create checkpoint folder {}: {}", dir_, ec.message());
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = step_of(name);
    if (step >= 0) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string CheckpointManager::save(int64_t step, const CheckpointData& data) {
  const std::string path = (fs::path(dir_) / fmt::format("ckpt-{:09d}.safetensors", step)).string();
  write_checkpoint(path, data);
  auto all = list();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
  // Temporary files of writers that died (law 5: they never replaced a checkpoint).
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (is_atomic_temp_name(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  return path;
}

std::optional<CheckpointData> CheckpointManager::load_latest(std::string* path_out) const {
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      CheckpointData data = read_checkpoint(*it);
      if (path_out != nullptr) *path_out = *it;
      return data;
    } catch (const Error& e) {
      log_warn("skipping checkpoint {}: {}", *it, e.what());
    }
  }
  return std::nullopt;
}

void CheckpointManager::clear() const {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (step_of(name) >= 0 || is_atomic_temp_name(name)) fs::remove(entry.path(), ec);
  }
}

}  // namespace crucible::train
