// .npz on libzip: read from memory (the mapped file), header first, data into memory under a
// budget or streamed in chunks; write to a temporary then commit.
#include "crucible/io/npz.h"

#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
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

// Streaming reads inflate this much at a time.
constexpr uint64_t kChunk = 1 << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<zip_file_t, ZipFileCloser> open_member(zip_t* zip, uint64_t index, const std::string& where) {
  std::unique_ptr<zip_file_t, ZipFileCloser> f(zip_fopen_index(zip, index, 0));
  if (!f) throw bad_input("{}: cannot open member: {}", where, zip_strerror(zip));
  return f;
}

// Reads `n` bytes of an open member into `dst`, fewer only at its end; `offset` (bytes read
// before) is for messages.
uint64_t read_up_to(zip_file_t* f, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& where) {
  uint64_t got = 0;
  while (got < n) {
    const zip_int64_t r = zip_fread(f, dst + got, n - got);
    if (r < 0) throw bad_input("{}: corrupt member after {} bytes: {}", where, offset + got, zip_file_strerror(f));
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return got;
}

// After `got` bytes of a member the zip directory says holds `size`: nothing may follow
// (reading past the end is also where libzip checks the CRC).
void expect_end(zip_file_t* f, uint64_t got, uint64_t size, const std::string& where) {
  if (got != size) throw bad_input("{}: member holds {} bytes, the zip directory says {}", where, got, size);
  char extra;
  const zip_int64_t r = zip_fread(f, &extra, 1);
  if (r > 0) throw bad_input("{}: member is longer than the zip directory says", where);
  if (r < 0) throw bad_input("{}: corrupt member after {} bytes: {}", where, got, zip_file_strerror(f));
}

}  // namespace

NpzArchive::NpzArchive(const uint8_t* data, size_t size, std::string name) : name_(std::move(name)) {
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* src = zip_source_buffer_create(data, size, 0, &err);
  if (src == nullptr) throw runtime_error("{}: libzip: {}", name_, zip_error_strerror(&err));
  zip_ = zip_open_from_source(src, ZIP_RDONLY, &err);
  if (zip_ == nullptr) {
    zip_source_free(src);
    std::string why = zip_error_strerror(&err);
    zip_error_fini(&err);
    throw bad_input("{}: not a readable zip archive (.npz): {}", name_, why);
  }
  // From here the destructor does not run on a throw: the guard closes the archive.
  std::unique_ptr<zip_t, ZipCloser> guard(zip_);
  const zip_int64_t n = zip_get_num_entries(zip_, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(zip_, static_cast<zip_uint64_t>(i), 0, &st) != 0) {
      throw bad_input("{}: zip entry {}: {}", name_, i, zip_strerror(zip_));
    }
    const std::string member = st.name != nullptr ? st.name : "";
    if (!ends_with(member, ".npy")) {
      skipped_.push_back(member);
      continue;
    }
    const std::string where = name_ + ":" + member;
    if ((st.valid & ZIP_STAT_SIZE) == 0 || (st.valid & ZIP_STAT_COMP_SIZE) == 0) {
      throw bad_input("{}: the zip directory gives no size", where);
    }
    if (st.comp_size > size ||
        (st.comp_method == ZIP_CM_STORE ? st.size > size : st.size > st.comp_size * kMaxRatio + (1u << 20))) {
      throw bad_input("{}: declares {} bytes uncompressed from {} compressed bytes, more than deflate can produce "
                      "(zip bomb?)",
                      where, st.size, st.comp_size);
    }
    NpzMember m;
    m.name = member.substr(0, member.size() - 4);
    m.size = st.size;
    m.compressed_size = st.comp_size;
    m.index = static_cast<uint64_t>(i);
    // Issue 10: only the header is inflated; its length field bounds what is read (≤ 1 MiB).
    auto f = open_member(zip_, m.index, where);
    uint8_t prefix[12];
    const uint64_t n_prefix = read_up_to(f.get(), prefix, std::min<uint64_t>(sizeof prefix, st.size), 0, where);
    const uint64_t header_len = npy_header_length(prefix, n_prefix, where);
    std::vector<uint8_t> header(std::max<uint64_t>(n_prefix, std::min<uint64_t>(header_len, st.size)));
    std::memcpy(header.data(), prefix, n_prefix);
    const uint64_t have =
        n_prefix + read_up_to(f.get(), header.data() + n_prefix, header.size() - n_prefix, n_prefix, where);
    m.header = parse_npy_header_prefix(header.data(), have, where);
    const NpyHeader& h = m.header;
    const uint64_t need = checked_nbytes(h.shape.data(), h.shape.size(), h.dtype, where);
    if (h.data_offset + need != st.size) {
      throw bad_input("{}: the .npy header declares shape ({}) of {}, {} data bytes after a {}-byte header "
                      "({} in all), but the zip directory says the member holds {} bytes",
                      where, fmt::join(h.shape, ", "), dtype_name(h.dtype), need, h.data_offset, h.data_offset + need,
                      st.size);
    }
    members_.push_back(std::move(m));
  }
  guard.release();
}

NpzArchive::~NpzArchive() {
  if (zip_ != nullptr) zip_discard(zip_);
}

std::string NpzArchive::where(const NpzMember& m) const { return name_ + ":" + m.name + ".npy"; }

Array NpzArchive::read(const NpzMember& m, MemoryBudget& budget) {
  const std::string where = this->where(m);
  budget.take(m.size, m.compressed_size, where);
  auto f = open_member(zip_, m.index, where);
  auto buf = std::make_shared<std::vector<uint8_t>>(m.size);
  const uint64_t got = read_up_to(f.get(), buf->data(), m.size, 0, where);
  expect_end(f.get(), got, m.size, where);
  return parse_npy(buf->data(), buf->size(), where, buf);
}

void NpzArchive::stream_data(const NpzMember& m, const std::function<void(const uint8_t*, size_t)>& sink) {
  const std::string where = this->where(m);
  auto f = open_member(zip_, m.index, where);
  std::vector<uint8_t> chunk(std::min<uint64_t>(kChunk, m.size));
  const uint64_t skip = m.header.data_offset;
  uint64_t got = 0;
  while (got < m.size) {
    const uint64_t want = std::min<uint64_t>(chunk.size(), m.size - got);
    const uint64_t n = read_up_to(f.get(), chunk.data(), want, got, where);
    const uint64_t begin = got < skip ? std::min(skip - got, n) : 0;  // the header is not data
    if (n > begin) sink(chunk.data() + begin, n - begin);
    got += n;
    if (n < want) break;
  }
  expect_end(f.get(), got, m.size, where);
}

std::vector<NamedArray> parse_npz(const uint8_t* data, size_t size, const std::string& name,
                                  std::vector<std::string>* skipped, uint64_t memory_budget) {
  NpzArchive zip(data, size, name);
  MemoryBudget budget(memory_budget);
  std::vector<NamedArray> out;
  for (const NpzMember& m : zip.members()) out.push_back({m.name, zip.read(m, budget)});
  if (skipped != nullptr) skipped->insert(skipped->end(), zip.skipped().begin(), zip.skipped().end());
  return out;
}

std::vector<NamedArray> read_npz(const std::string& path, std::vector<std::string>* skipped, uint64_t memory_budget) {
  auto file = MappedFile::open(path);
  return parse_npz(file->data(), file->size(), path, skipped, memory_budget);
}

namespace {
constexpr time_t kMemberTime = 946684800;  // 2000-01-01T00:00:00Z
}  // namespace

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
    // A fixed member time (2000-01-01, representable as a DOS date in any time zone), not the
    // clock's: the same arrays give the same bytes, and so the same checksum, on every write.
    zip_file_set_mtime(zip.get(), static_cast<zip_uint64_t>(idx), kMemberTime, 0);
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
