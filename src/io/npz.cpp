// .npz on libzip: read from memory (the mapped file), write to a temporary then commit.
#include "crucible/io/npz.h"

#include <unistd.h>
#include <zip.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/mmap.h"
#include "crucible/io/npy.h"

namespace crucible::io {
namespace {

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

// Deflate expands at most ~1032:1; allow a little slack for headers.
constexpr uint64_t kMaxRatio = 1100;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<NamedArray> parse_npz(const uint8_t* data, size_t size, const std::string& name,
                                  std::vector<std::string>* skipped) {
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* src = zip_source_buffer_create(data, size, 0, &err);
  if (src == nullptr) throw runtime_error("{}: libzip: {}", name, zip_error_strerror(&err));
  std::unique_ptr<zip_t, ZipCloser> zip(zip_open_from_source(src, ZIP_RDONLY, &err));
  if (!zip) {
    zip_source_free(src);
    std::string why = zip_error_strerror(&err);
    zip_error_fini(&err);
    throw bad_input("{}: not a readable zip archive (.npz): {}", name, why);
  }
  std::vector<NamedArray> out;
  const zip_int64_t n = zip_get_num_entries(zip.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(zip.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0) {
      throw bad_input("{}: zip entry {}: {}", name, i, zip_strerror(zip.get()));
    }
    const std::string member = st.name != nullptr ? st.name : "";
    if (!ends_with(member, ".npy")) {
      if (skipped != nullptr) skipped->push_back(member);
      continue;
    }
    const std::string where = name + ":" + member;
    if ((st.valid & ZIP_STAT_SIZE) == 0 || (st.valid & ZIP_STAT_COMP_SIZE) == 0) {
      throw bad_input("{}: the zip directory gives no size", where);
    }
    if (st.comp_size > size ||
        (st.comp_method == ZIP_CM_STORE ? st.size > size : st.size > st.comp_size * kMaxRatio + (1u << 20))) {
      throw bad_input("{}: declares {} bytes uncompressed from {} compressed bytes, more than deflate can produce "
                      "(zip bomb?)",
                      where, st.size, st.comp_size);
    }
    std::unique_ptr<zip_file_t, ZipFileCloser> f(zip_fopen_index(zip.get(), static_cast<zip_uint64_t>(i), 0));
    if (!f) throw bad_input("{}: cannot open member: {}", where, zip_strerror(zip.get()));
    auto buf = std::make_shared<std::vector<uint8_t>>(st.size);
    zip_uint64_t got = 0;
    while (got < st.size) {
      zip_int64_t r = zip_fread(f.get(), buf->data() + got, st.size - got);
      if (r < 0) throw bad_input("{}: corrupt member after {} bytes: {}", where, got, zip_file_strerror(f.get()));
      if (r == 0) break;
      got += static_cast<zip_uint64_t>(r);
    }
    if (got != st.size) throw bad_input("{}: member holds {} bytes, the zip directory says {}", where, got, st.size);
    char extra;
    if (zip_fread(f.get(), &extra, 1) != 0) throw bad_input("{}: member is longer than the zip directory says", where);
    NamedArray na;
    na.name = member.substr(0, member.size() - 4);
    na.array = parse_npy(buf->data(), buf->size(), where, buf);
    out.push_back(std::move(na));
  }
  return out;
}

std::vector<NamedArray> read_npz(const std::string& path, std::vector<std::string>* skipped) {
  auto file = MappedFile::open(path);
  return parse_npz(file->data(), file->size(), path, skipped);
}

void write_npz(const std::string& path, const std::vector<NamedArray>& arrays, bool compress) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::remove(tmp.c_str());
  int errorp = 0;
  std::unique_ptr<zip_t, ZipCloser> zip(zip_open(tmp.c_str(), ZIP_CREATE | ZIP_EXCL, &errorp));
  if (!zip) throw runtime_error("cannot create {}: libzip error {}", tmp, errorp);
  std::vector<std::string> members;  // the buffers must live until zip_close
  members.reserve(arrays.size());
  for (const auto& a : arrays) {
    members.push_back(npy_bytes(a.array, path + ":" + a.name));
    zip_source_t* s = zip_source_buffer(zip.get(), members.back().data(), members.back().size(), 0);
    if (s == nullptr) throw runtime_error("{}: libzip: {}", path, zip_strerror(zip.get()));
    zip_int64_t idx = zip_file_add(zip.get(), (a.name + ".npy").c_str(), s, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(s);
      throw bad_input("{}: cannot add member {}.npy: {}", path, a.name, zip_strerror(zip.get()));
    }
    zip_set_file_compression(zip.get(), static_cast<zip_uint64_t>(idx), compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
  }
  if (zip_close(zip.get()) != 0) {
    std::string why = zip_strerror(zip.get());
    std::remove(tmp.c_str());
    throw runtime_error("cannot write {}: {}", path, why);
  }
  zip.release();
  commit_file(tmp, path);
}

}  // namespace crucible::io
