// PT2 archives: the zip (zip_archive.h over the memory-mapped file), the layout of
// torch/export/pt2_archive (archive_format "pt2", models/, data/weights/, data/constants/) and
// the payload configs' JSON (nlohmann). Writing a copy goes through libzip's own writer.
#include "crucible/io/pt2.h"

#include <zip.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"
#include "zip_archive.h"

namespace crucible::io {
namespace {

using nlohmann::json;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// A serialized int: {"as_int": n} (a SymInt of the schema); anything else (a symbolic size) is
// refused, since weights have fixed shapes.
int64_t sym_int(const json& j, const std::string& where) {
  if (j.is_object() && j.contains("as_int") && j["as_int"].is_number_integer()) return j["as_int"].get<int64_t>();
  throw bad_input("{}: expected a fixed size {{\"as_int\": n}}, found {}", where, j.dump().substr(0, 80));
}

}  // namespace

Pt2Archive::Pt2Archive(const std::string& path) : path_(path), zip_(std::make_unique<ZipArchive>()) {
  file_ = MappedFile::open(path);
  std::string why;
  if (!zip_->open(file_->data(), file_->size(), path, &why)) {
    throw bad_input("model.path = \"{}\": not a zip archive ({}): expected a .pt2 written by torch.export.save or "
                    "crucible.export",
                    path, why);
  }
  for (const std::string& name : zip_->names()) {
    if (ends_with(name, "serialized_exported_program.json")) {
      throw bad_input("model.path = \"{}\": the flat layout of torch < 2.6 (serialized_exported_program.json); crucible "
                      "reads the PT2 archive layout: load it with that torch and save it again with torch >= 2.6's "
                      "torch.export.save (or crucible.export)",
                      path);
    }
    const auto slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash + 1, std::string::npos, "archive_format") == 0) {
      root_ = name.substr(0, slash + 1);
    }
  }
  if (root_.empty()) {
    throw bad_input("model.path = \"{}\": a zip without <folder>/archive_format, so not a PT2 archive (a TorchScript "
                    "module? use model.name = \"torchscript\"); expected a .pt2 written by torch.export.save",
                    path);
  }
  const Pt2Bytes format = bytes(root_ + "archive_format");
  const std::string value(reinterpret_cast<const char*>(format.data), format.size);
  if (value != "pt2") {
    throw bad_input("model.path = \"{}\": archive_format is \"{}\", expected \"pt2\"", path, shown(value, 40));
  }
  const std::string models = root_ + "models/";
  for (const std::string& name : zip_->names()) {
    if (starts_with(name, models) && ends_with(name, ".json") &&
        name.find('/', models.size()) == std::string::npos) {
      programs_.push_back(name.substr(models.size(), name.size() - models.size() - 5));
    }
  }
  if (programs_.empty()) {
    throw bad_input("model.path = \"{}\": the archive holds no exported program ({}models/*.json): an AOTInductor "
                    "package holds compiled code only, which cannot be trained",
                    path, root_);
  }
  std::sort(programs_.begin(), programs_.end());
}

Pt2Archive::~Pt2Archive() = default;

bool Pt2Archive::has(const std::string& member) const { return zip_->find(member) >= 0; }

bool Pt2Archive::has_program(const std::string& name) const {
  return std::find(programs_.begin(), programs_.end(), name) != programs_.end();
}

Pt2Bytes Pt2Archive::bytes(const std::string& member) const {
  const int64_t index = zip_->find(member);
  if (index < 0) throw bad_input("model.path = \"{}\": the archive has no member {}", path_, shown(member));
  MemberBytes b = zip_->bytes(static_cast<zip_uint64_t>(index));
  Pt2Bytes out;
  out.data = b.data;
  out.size = b.size;
  out.owner = b.owner ? b.owner : std::static_pointer_cast<const void>(file_);
  return out;
}

std::string Pt2Archive::program_json(const std::string& name) const {
  const Pt2Bytes b = bytes(root_ + "models/" + name + ".json");
  return std::string(reinterpret_cast<const char*>(b.data), b.size);
}

std::vector<Pt2Tensor> Pt2Archive::payload(const std::string& config, const std::string& folder) const {
  std::vector<Pt2Tensor> out;
  if (!has(config)) return out;
  const Pt2Bytes b = bytes(config);
  json j;
  try {
    j = json::parse(b.data, b.data + b.size);
  } catch (const json::exception& e) {
    throw bad_input("model.path = \"{}\": {} is not JSON: {}", path_, config, e.what());
  }
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) {
    throw bad_input("model.path = \"{}\": {} has no \"config\" object", path_, config);
  }
  for (const auto& [name, meta] : j["config"].items()) {
    const std::string where = fmt::format("model.path = \"{}\": {} entry \"{}\"", path_, config, name);
    try {
      Pt2Tensor t;
      t.name = name;
      if (meta.value("use_pickle", false)) {
        throw bad_input("{}: a pickled tensor (a tensor subclass such as a quantized or distributed tensor); crucible "
                        "reads plain tensors",
                        where);
      }
      t.member = root_ + folder + meta.at("path_name").get<std::string>();
      t.is_param = meta.value("is_param", false);
      const json& tm = meta.at("tensor_meta");
      t.serde_dtype = tm.at("dtype").get<int>();
      for (const json& s : tm.at("sizes")) t.sizes.push_back(sym_int(s, where + " size"));
      for (const json& s : tm.at("strides")) t.strides.push_back(sym_int(s, where + " stride"));
      t.storage_offset = sym_int(tm.at("storage_offset"), where + " storage_offset");
      if (t.sizes.size() != t.strides.size()) {
        throw bad_input("{}: {} sizes but {} strides", where, t.sizes.size(), t.strides.size());
      }
      out.push_back(std::move(t));
    } catch (const json::exception& e) {
      throw bad_input("{}: {}", where, e.what());
    }
  }
  return out;
}

std::vector<Pt2Tensor> Pt2Archive::weights(const std::string& program) const {
  return payload(root_ + "data/weights/" + program + "_weights_config.json", "data/weights/");
}

std::vector<Pt2Tensor> Pt2Archive::constants(const std::string& program) const {
  return payload(root_ + "data/constants/" + program + "_constants_config.json", "data/constants/");
}

void write_pt2_replacing(const std::string& source, const std::string& path,
                         const std::map<std::string, std::string>& replaced) {
  const std::string tmp = path + ".tmp-pt2";
  std::error_code ec;
  std::filesystem::copy_file(source, tmp, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) throw runtime_error("{}: cannot copy {} to write the trained weights: {}", path, source, ec.message());
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), 0, &err);
  if (z == nullptr) {
    std::remove(tmp.c_str());
    throw runtime_error("{}: libzip cannot open the copy of {} (error {})", path, source, err);
  }
  auto fail = [&](const std::string& why) {
    zip_discard(z);
    std::remove(tmp.c_str());
    throw runtime_error("{}: {}", path, why);
  };
  for (const auto& [member, data] : replaced) {
    const zip_int64_t index = zip_name_locate(z, member.c_str(), 0);
    if (index < 0) fail(fmt::format("{} has no member {}", source, member));
    zip_source_t* s = zip_source_buffer(z, data.data(), data.size(), 0);  // `replaced` outlives zip_close
    if (s == nullptr || zip_file_replace(z, static_cast<zip_uint64_t>(index), s, 0) != 0) {
      if (s != nullptr) zip_source_free(s);
      fail(fmt::format("replacing {}: {}", member, zip_strerror(z)));
    }
    zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
  }
  if (zip_close(z) != 0) fail(fmt::format("writing: {}", zip_strerror(z)));
  commit_file(tmp, path);
}

}  // namespace crucible::io
