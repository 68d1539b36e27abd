// pack_samples (see pack.h): reads a SampleSource in chunks, decodes/re-encodes each chunk on a
// thread pool, writes the results in source order into aligned shard temporaries, and commits
// the shards then the index (law 5). Also write_lmdb, the LMDB writer behind `pack --lmdb`.
#include "crucible/data/formats/pack.h"

#include <fcntl.h>
#include <lmdb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/sha256.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/formats/json_target.h"
#include "crucible/data/formats/pack_format.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;


const char* mode_name(PackOptions::Mode m) {
  switch (m) {
    case PackOptions::Mode::kOriginal: return "original";
    case PackOptions::Mode::kReencode: return "reencode";
    case PackOptions::Mode::kRaw: return "raw";
  }
  return "?";
}

// "name: reason" without repeating the name when the error message already starts with it.
std::string bad_entry(const std::string& name, const std::string& what) {
  if (what.compare(0, name.size() + 2, name + ": ") == 0) return what;
  return name + ": " + what;
}

// ---- resizing ------------------------------------------------------------------------------

// For each output index, the source indices it covers and their weights (a box filter with
// fractional coverage: area averaging when shrinking, nearest/linear blend when growing).
std::vector<std::vector<std::pair<int, float>>> area_weights(int src, int dst) {
  std::vector<std::vector<std::pair<int, float>>> w(static_cast<size_t>(dst));
  const double scale = static_cast<double>(src) / dst;
  for (int o = 0; o < dst; ++o) {
    const double a = o * scale, b = (o + 1) * scale;
    double total = 0;
    for (int i = static_cast<int>(std::floor(a)); i < src && i < b; ++i) {
      const double overlap = std::min<double>(b, i + 1) - std::max<double>(a, i);
      if (overlap <= 1e-9) continue;
      w[static_cast<size_t>(o)].emplace_back(i, static_cast<float>(overlap));
      total += overlap;
    }
    for (auto& [i, x] : w[static_cast<size_t>(o)]) x = static_cast<float>(x / total);
  }
  return w;
}

// [sh, sw, 3] → [dh, dw, 3] uint8, separable area resize.
std::vector<uint8_t> resize_area(const uint8_t* src, int sw, int sh, int dw, int dh) {
  const auto wx = area_weights(sw, dw), wy = area_weights(sh, dh);
  std::vector<float> rows(static_cast<size_t>(sh) * dw * 3);
  for (int y = 0; y < sh; ++y) {
    const uint8_t* s = src + static_cast<size_t>(y) * sw * 3;
    float* r = rows.data() + static_cast<size_t>(y) * dw * 3;
    for (int x = 0; x < dw; ++x) {
      float acc[3] = {0, 0, 0};
      for (const auto& [i, w] : wx[static_cast<size_t>(x)]) {
        for (int c = 0; c < 3; ++c) acc[c] += w * s[i * 3 + c];
      }
      for (int c = 0; c < 3; ++c) r[x * 3 + c] = acc[c];
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(dh) * dw * 3);
  for (int y = 0; y < dh; ++y) {
    uint8_t* o = out.data() + static_cast<size_t>(y) * dw * 3;
    for (int x = 0; x < dw * 3; ++x) {
      float acc = 0;
      for (const auto& [i, w] : wy[static_cast<size_t>(y)]) acc += w * rows[static_cast<size_t>(i) * dw * 3 + x];
      o[x] = static_cast<uint8_t>(std::clamp(std::lround(acc), 0L, 255L));
    }
  }
  return out;
}

// ---- per-sample work (runs on the pool) ----------------------------------------------------

struct Item {
  EncodedSample sample;         // the bytes to write when not transformed
  std::vector<uint8_t> owned;   // re-encoded JPEG or raw pixels
  bool transformed = false;
  std::string target;           // a detection sample's JSON target (json_target.h), written after its image
  int width = 0, height = 0;    // a detection sample's stored image size
  std::string bad;              // non-empty: left out of the pack, reported
  std::exception_ptr error;     // the pack fails with this
};

DecodeOptions decode_options(bool exif) {
  DecodeOptions d;
  d.exif_orientation = exif;
  return d;
}

// A detection sample's image size (the source's, else its header's) and its JSON target.
void detection_target(const EncodedSample& s, const PackOptions&, bool exif, Item* item) {
  item->width = s.width;
  item->height = s.height;
  if (item->width <= 0 || item->height <= 0) {
    const ImageInfo info = probe_image(s.data, s.size, s.name, exif);
    item->width = info.width;
    item->height = info.height;
  }
  item->target = json_target(*s.boxes, s.image_id, item->width, item->height);
}

// The target of an image resized from item->width × item->height to tw × th: each box scaled by
// the same factors in float32, as torchvision's resize scales boxes.
void scale_target(const EncodedSample& s, int tw, int th, Item* item) {
  if (tw == item->width && th == item->height) return;
  Boxes b = *s.boxes;
  const float sx = static_cast<float>(tw) / static_cast<float>(item->width);
  const float sy = static_cast<float>(th) / static_cast<float>(item->height);
  for (size_t i = 0; i < b.size(); ++i) {
    b.xyxy[4 * i] *= sx, b.xyxy[4 * i + 2] *= sx;
    b.xyxy[4 * i + 1] *= sy, b.xyxy[4 * i + 3] *= sy;
  }
  item->width = tw;
  item->height = th;
  item->target = json_target(b, s.image_id, tw, th);
}

void process(const SampleSource& source, int64_t index, const PackOptions& o, Item* item) {
  const bool decodes = o.validate || o.mode != PackOptions::Mode::kOriginal;
  try {
    item->sample = source.get(index);
  } catch (const Error& e) {
    // D5: under validation a sample that cannot be read is left out and named; otherwise the
    // pack fails (an unreadable file is not a policy decision to take silently).
    if (!decodes || e.kind() != ErrorKind::kBadInput) throw;
    item->bad = bad_entry(fmt::format("sample {}", index), e.what());
    return;
  }
  const EncodedSample& s = item->sample;
  // Detection: the boxes are in the frame of the pixels the source decodes (COCO's: as stored,
  // without the EXIF orientation), so every decode here uses the source's choice.
  const bool exif = source.exif_orientation();
  const bool boxes = source.has_boxes();
  if (boxes && s.boxes == nullptr) throw std::logic_error("pack: a detection source gave a sample without boxes");
  if (!decodes) {
    if (boxes) detection_target(s, o, exif, item);
    return;
  }
  try {
    if (o.mode == PackOptions::Mode::kOriginal) {
      const DecodedImage img = decode_image(s.data, s.size, s.name, decode_options(exif));
      if (boxes) {
        detection_target(s, o, exif, item);
        if (img.width != item->width || img.height != item->height) {  // D17
          throw bad_input("{}: the image is {}x{} pixels but its annotations say {}x{}", s.name, img.width, img.height,
                          item->width, item->height);
        }
      }
      return;
    }
    const ImageInfo info = probe_image(s.data, s.size, s.name, exif);
    int tw = info.width, th = info.height;
    const int longest = std::max(info.width, info.height);
    DecodeOptions d = decode_options(exif);
    if (o.max_side > 0 && longest > o.max_side) {
      tw = std::max<int>(1, static_cast<int>((int64_t{info.width} * o.max_side + longest / 2) / longest));
      th = std::max<int>(1, static_cast<int>((int64_t{info.height} * o.max_side + longest / 2) / longest));
      d.min_width = tw;  // D2: let the decoder scale down (M/8) as far as the target allows
      d.min_height = th;
    }
    DecodedImage img = decode_image(s.data, s.size, s.name, d);
    std::vector<uint8_t> pixels = std::move(img.pixels);
    if (img.width != tw || img.height != th) {
      pixels = resize_area(pixels.data(), img.width, img.height, tw, th);
    }
    if (o.mode == PackOptions::Mode::kReencode) {
      item->owned = encode_jpeg(pixels.data(), tw, th, o.quality);
    } else {
      item->owned.resize(kRawHeaderBytes + pixels.size());
      uint8_t* h = item->owned.data();
      std::memcpy(h, kRawMagic, 4);
      const uint32_t fields[3] = {static_cast<uint32_t>(th), static_cast<uint32_t>(tw), 3};
      for (int f = 0; f < 3; ++f) {
        for (int b = 0; b < 4; ++b) h[4 + 4 * f + b] = static_cast<uint8_t>((fields[f] >> (8 * b)) & 0xff);
      }
      std::memcpy(h + kRawHeaderBytes, pixels.data(), pixels.size());
    }
    if (boxes) {
      detection_target(s, o, exif, item);
      if (info.width != item->width || info.height != item->height) {  // D17
        throw bad_input("{}: the image is {}x{} pixels but its annotations say {}x{}", s.name, info.width, info.height,
                        item->width, item->height);
      }
      scale_target(s, tw, th, item);
    }
    item->transformed = true;
    item->sample.hold.reset();  // the source's bytes are no longer needed
    item->sample.data = nullptr;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kBadInput) throw;
    item->bad = bad_entry(s.name, e.what());
  }
}

// Counts finished tasks of one chunk; wait() blocks until all have finished.
class Latch {
 public:
  explicit Latch(int64_t n) : left_(n) {}
  void count_down() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t left_;
};

// ---- shard files ---------------------------------------------------------------------------

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw runtime_error("cannot write {}: {}", path, errno_text(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// Shard temporaries "<shard>.tmp-<pid>": one open at a time (D6), all removed unless committed.
class ShardFiles {
 public:
  explicit ShardFiles(std::string dir) : dir_(std::move(dir)) {}
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;
  ~ShardFiles() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) {
      for (const auto& s : shards_) ::unlink(s.tmp.c_str());
    }
  }

  // Starts the next shard file.
  void open_next() {
    close_current();
    Shard s;
    s.name = fmt::format("shard-{:05d}.bin", shards_.size());
    s.path = dir_ + "/" + s.name;
    s.tmp = s.path + ".tmp-" + std::to_string(::getpid());
    fd_ = ::open(s.tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw runtime_error("cannot create {}: {}", s.tmp, errno_text(errno));
    s.sha256 = std::make_shared<Sha256>();
    shards_.push_back(std::move(s));
    offset_ = 0;
  }

  bool empty() const { return shards_.empty(); }
  uint64_t offset() const { return offset_; }
  uint32_t current() const { return static_cast<uint32_t>(shards_.size() - 1); }

  void write(const void* data, size_t size) {
    write_all(fd_, data, size, shards_.back().tmp);
    shards_.back().sha256->update(data, size);
    offset_ += size;
  }

  void close_current() {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw runtime_error("cannot close {}: {}", shards_.back().tmp, errno_text(errno));
    shards_.back().bytes = offset_;
    shards_.back().digest = shards_.back().sha256->hex_digest();
  }

  // fsync + rename every shard into place; the caller writes the index afterwards.
  void commit_all() {
    close_current();
    for (const auto& s : shards_) commit_file(s.tmp, s.path);
    committed_ = true;
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& s : shards_) out.push_back(s.name);
    return out;
  }
  // Each shard's size and SHA-256: what a reader that fetched a shard checks it against.
  std::vector<uint64_t> sizes() const {
    std::vector<uint64_t> out;
    for (const auto& s : shards_) out.push_back(s.bytes);
    return out;
  }
  std::vector<std::string> digests() const {
    std::vector<std::string> out;
    for (const auto& s : shards_) out.push_back(s.digest);
    return out;
  }
  std::vector<std::string> paths() const {
    std::vector<std::string> out;
    for (const auto& s : shards_) out.push_back(s.path);
    return out;
  }

 private:
  struct Shard {
    std::string name, path, tmp;
    std::shared_ptr<Sha256> sha256;
    uint64_t bytes = 0;
    std::string digest;
  };
  std::string dir_;
  std::vector<Shard> shards_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

void check_options(const PackOptions& o) {
  if (o.align < 64 || (o.align & (o.align - 1)) != 0) {
    throw bad_input("pack: align should be a power of two >= 64, found {}", o.align);
  }
  if (o.shard_bytes <= 0) throw bad_input("pack: shard_bytes should be positive, found {}", o.shard_bytes);
  if (o.threads < 1) throw bad_input("pack: threads should be >= 1, found {}", o.threads);
  if (o.max_side < 0) throw bad_input("pack: max_side should be >= 0 (0 = keep the size), found {}", o.max_side);
  if (o.quality < 1 || o.quality > 100) throw bad_input("pack: JPEG quality should be in 1..100, found {}", o.quality);
}

}  // namespace

PackReport pack_samples(const SampleSource& source, const std::string& dst, const PackOptions& options) {
  check_options(options);
  std::error_code ec;
  if (fs::exists(dst, ec) && !fs::is_directory(dst, ec)) throw bad_input("pack: {} exists and is not a folder", dst);
  fs::create_directories(dst, ec);
  if (ec) throw runtime_error("pack: cannot create folder {}: {}", dst, ec.message());
  const std::string index_path = dst + "/index.crpk";
  // Law 5: an old index would point into the shards about to be replaced; drop it first so a
  // pack that fails or is killed leaves no index at all.
  if (fs::exists(index_path, ec)) {
    if (::unlink(index_path.c_str()) != 0) {
      throw runtime_error("pack: cannot remove the old {}: {}", index_path, errno_text(errno));
    }
    fsync_dir(dst);
  }

  PackReport report;
  ShardFiles shards(dst);
  std::string records;
  const std::vector<char> zeros(static_cast<size_t>(options.align), 0);
  std::unique_ptr<ThreadPool> pool;
  if (options.threads > 1) pool = std::make_unique<ThreadPool>(options.threads, "crucible-pack");
  const int64_t chunk = std::max<int64_t>(256, int64_t{32} * options.threads);
  const int64_t n = source.size();
  const bool boxes = source.has_boxes();

  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    std::vector<Item> items(static_cast<size_t>(end - begin));
    auto run = [&](int64_t i) {
      Item* item = &items[static_cast<size_t>(i - begin)];
      try {
        process(source, i, options, item);
      } catch (...) {
        item->error = std::current_exception();  // rethrown below, on the writing thread
      }
    };
    if (pool) {
      Latch latch(end - begin);
      for (int64_t i = begin; i < end; ++i) {
        pool->submit([&, i] {
          run(i);
          latch.count_down();
        });
      }
      latch.wait();
    } else {
      for (int64_t i = begin; i < end; ++i) run(i);
    }

    for (Item& item : items) {  // source order
      if (item.error) std::rethrow_exception(item.error);
      if (!item.bad.empty()) {
        report.bad.push_back(std::move(item.bad));
        continue;
      }
      const uint8_t* data = item.transformed ? item.owned.data() : item.sample.data;
      const size_t size = item.transformed ? item.owned.size() : item.sample.size;
      if (size > UINT32_MAX) {
        throw bad_input("pack: {} holds {} bytes; packed samples are limited to 4 GiB - 1", item.sample.name, size);
      }
      if (item.target.size() > UINT32_MAX) {
        throw bad_input("pack: {}'s target holds {} bytes of JSON; targets are limited to 4 GiB - 1", item.sample.name,
                        item.target.size());
      }
      const auto align = static_cast<uint64_t>(options.align);
      const uint64_t extent = size + item.target.size();  // a detection sample's target follows its image
      uint64_t at = shards.empty() ? 0 : (shards.offset() + align - 1) / align * align;
      if (shards.empty() || (shards.offset() > 0 && at + extent > static_cast<uint64_t>(options.shard_bytes))) {
        shards.open_next();
        at = 0;
      }
      shards.write(zeros.data(), static_cast<size_t>(at - shards.offset()));
      shards.write(data, size);
      shards.write(item.target.data(), item.target.size());
      pack_format::Record record{shards.current(), static_cast<uint32_t>(size), at, item.sample.label};
      record.target_size = static_cast<uint32_t>(item.target.size());
      record.width = static_cast<uint32_t>(item.width);
      record.height = static_cast<uint32_t>(item.height);
      pack_format::append_record(records, record, boxes);
      ++report.samples;
      report.bytes += static_cast<int64_t>(extent);
    }
  }

  nlohmann::json header = {{"version", boxes ? pack_format::kVersionBoxes : pack_format::kVersion},
                           {"classes", source.classes()},
                           {"samples", report.samples},
                           {"shards", shards.names()},
                           {"align", options.align},
                           {"mode", mode_name(options.mode)}};
  if (boxes) {
    const BoxCounts c = source.box_counts();
    header["target"] = "boxes";
    header["category_ids"] = source.category_ids();
    header["box_counts"] = {{"kept", c.kept}, {"clamped", c.clamped}, {"dropped", c.dropped}};
    // Original bytes keep the frame the source decoded them in; re-encoded or raw pixels were
    // decoded in it, and carry no orientation tag.
    header["exif_orientation"] = options.mode == PackOptions::Mode::kOriginal && source.exif_orientation();
  }
  if (options.mode != PackOptions::Mode::kOriginal) header["max_side"] = options.max_side;
  if (options.mode == PackOptions::Mode::kReencode) header["quality"] = options.quality;
  shards.close_current();
  header["shard_bytes"] = shards.sizes();
  header["shard_sha256"] = shards.digests();
  const std::string json = header.dump();
  std::string index = pack_format::header_prefix(json.size());
  index += json;
  index += records;

  shards.commit_all();
  write_file_atomic(index_path, index);  // last: it is what makes the shards visible
  report.files = shards.paths();
  report.files.push_back(index_path);
  return report;
}

// ---- LMDB writer ---------------------------------------------------------------------------

void write_lmdb(const SampleSource& source, const std::string& path) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) {
    throw bad_input("write_lmdb: {} exists and is not a folder", path);
  }
  fs::create_directories(path, ec);
  if (ec) throw runtime_error("write_lmdb: cannot create folder {}: {}", path, ec.message());
  const std::string final_path = path + "/data.mdb";
  const std::string tmp = final_path + ".tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());

  struct Guard {
    MDB_env* env = nullptr;
    std::string tmp;
    bool done = false;
    ~Guard() {
      if (env != nullptr) mdb_env_close(env);
      if (!done) ::unlink(tmp.c_str());
    }
  } guard;
  guard.tmp = tmp;
  int rc = mdb_env_create(&guard.env);
  if (rc != 0) throw runtime_error("write_lmdb {}: cannot create an environment: {}", path, mdb_strerror(rc));
  size_t map_size = size_t{64} << 20;
  mdb_env_set_mapsize(guard.env, map_size);
  // One writer, a fresh file: no lock file (MDB_NOLOCK); durability comes from commit_file.
  rc = mdb_env_open(guard.env, tmp.c_str(), MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC, 0644);
  if (rc != 0) throw runtime_error("write_lmdb: cannot create {}: {}", tmp, mdb_strerror(rc));

  // Puts (key, value) pairs in one transaction, growing the map when it is full.
  auto put_batch = [&](const std::vector<std::pair<std::string, std::string>>& batch) {
    for (;;) {
      MDB_txn* txn = nullptr;
      rc = mdb_txn_begin(guard.env, nullptr, 0, &txn);
      if (rc != 0) throw runtime_error("write_lmdb {}: cannot begin a transaction: {}", tmp, mdb_strerror(rc));
      MDB_dbi dbi = 0;
      rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
      for (size_t i = 0; rc == 0 && i < batch.size(); ++i) {
        MDB_val k{batch[i].first.size(), const_cast<char*>(batch[i].first.data())};
        MDB_val v{batch[i].second.size(), const_cast<char*>(batch[i].second.data())};
        rc = mdb_put(txn, dbi, &k, &v, MDB_APPEND);  // keys arrive in increasing order
      }
      if (rc == 0) {
        rc = mdb_txn_commit(txn);  // frees txn whatever the result
      } else {
        mdb_txn_abort(txn);
      }
      if (rc == MDB_MAP_FULL) {
        map_size *= 2;
        rc = mdb_env_set_mapsize(guard.env, map_size);
        if (rc != 0) throw runtime_error("write_lmdb {}: cannot grow the map: {}", tmp, mdb_strerror(rc));
        continue;
      }
      if (rc != 0) throw runtime_error("write_lmdb {}: cannot write: {}", tmp, mdb_strerror(rc));
      return;
    }
  };

  std::vector<std::pair<std::string, std::string>> batch;
  const int64_t n = source.size();
  for (int64_t i = 0; i < n; ++i) {
    const EncodedSample s = source.get(i);
    if (s.label < -1 || s.label >= int64_t{0xffffffff}) {
      throw bad_input("write_lmdb: {} has label {}; LMDB values hold a u32 label (-1 allowed)", s.name, s.label);
    }
    std::string value;
    value.reserve(4 + s.size);
    append_le32(value, static_cast<uint32_t>(s.label));
    value.append(reinterpret_cast<const char*>(s.data), s.size);
    batch.emplace_back(fmt::format("{:010d}", i), std::move(value));
    if (batch.size() >= 256) {
      put_batch(batch);
      batch.clear();
    }
  }
  if (!source.classes().empty()) {
    batch.emplace_back("__classes__", nlohmann::json(source.classes()).dump());  // '_' sorts after digits
  }
  if (!batch.empty()) put_batch(batch);
  rc = mdb_env_sync(guard.env, 1);
  if (rc != 0) throw runtime_error("write_lmdb {}: cannot sync: {}", tmp, mdb_strerror(rc));
  mdb_env_close(guard.env);
  guard.env = nullptr;
  commit_file(tmp, final_path);
  guard.done = true;
}

}  // namespace crucible::data
