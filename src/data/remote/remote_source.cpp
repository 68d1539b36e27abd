// Remote shards as a SampleSource (remote_source.h): open reads indexes, I/O threads fetch the
// planned shards into the shard cache ahead of the decode threads.
#include "crucible/data/remote/remote_source.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/data/remote/shard_cache.h"
#include "crucible/data/formats/shard_index.h"

namespace crucible::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Runs fn(0 … n-1) on up to `threads` threads; after a failure no new index starts, and the
// failure of the lowest index is rethrown (the same shard named whatever the timing).
template <typename Fn>
void parallel_for(size_t n, int threads, Fn fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  size_t error_index = n;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < error_index) error = std::current_exception(), error_index = i;
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int>(threads, static_cast<int>(n)); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

struct Record {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  int64_t label = -1;
  std::string key;  // tar: the sample's key; packed: empty (named by index)
  pack_format::Record packed;  // a packed detection sample: its target's size and its image's
};

// A packed detection set's targets (shard_index.h: PackedIndex), read per sample under `policy`.
struct RemoteBoxes {
  bool boxes = false;
  std::vector<int64_t> category_ids;
  BoxCounts counts;
  bool exif_orientation = true;
  BoxPolicy policy;
};

class RemoteShardSource final : public SampleSource {
 public:
  RemoteShardSource(std::string path, const RemoteSourceOptions& options, std::shared_ptr<RemoteStore> store,
                    std::shared_ptr<ShardCache> cache, std::vector<std::string> urls, std::vector<ShardCheck> checks,
                    std::vector<Record> records, std::vector<std::string> classes, std::string note,
                    RemoteBoxes boxes)
      : path_(std::move(path)),
        store_(std::move(store)),
        cache_(std::move(cache)),
        urls_(std::move(urls)),
        checks_(std::move(checks)),
        records_(std::move(records)),
        classes_(std::move(classes)),
        note_(std::move(note)),
        boxes_(std::move(boxes)),
        ahead_(options.ahead_shards > 0 ? options.ahead_shards : options.io_threads + 1),
        pins_(urls_.size()),
        remaining_(urls_.size(), 0) {
    for (int i = 0; i < std::max(1, options.io_threads); ++i) workers_.emplace_back([this] { fetch_ahead(); });
  }

  ~RemoteShardSource() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

  EncodedSample get(int64_t index) const override {
    const Record& r = records_.at(static_cast<size_t>(index));
    std::shared_ptr<const MappedFile> file, release;
    {
      std::lock_guard<std::mutex> lock(mu_);
      file = pins_[r.shard];
      if (remaining_[r.shard] > 0 && --remaining_[r.shard] == 0 && pins_[r.shard] != nullptr) {
        release = std::move(pins_[r.shard]);  // the sample below keeps its own reference
        --pinned_;
        cv_.notify_all();
      }
    }
    if (file == nullptr) {  // not fetched ahead: wait for it here, and keep it while there is room
      file = cache_->get(urls_[r.shard], checks_[r.shard]);
      std::lock_guard<std::mutex> lock(mu_);
      // Kept until the shard's last planned read or the next plan(); before any plan (a
      // measurement, `crucible bench decode`) until the first.
      const bool planned = remaining_[r.shard] != 0 && pinned_ + in_flight_ < ahead_;
      const bool unplanned = generation_ == 0 && pinned_ < ahead_;
      if (pins_[r.shard] == nullptr && (planned || unplanned)) {
        pins_[r.shard] = file;
        ++pinned_;
      }
    }
    if (r.offset > file->size() || r.size > file->size() - r.offset) {
      throw bad_input("{}: sample {} lies at bytes [{}, {}) but the shard holds {} bytes (its index is stale)",
                      urls_[r.shard], r.key.empty() ? std::to_string(index) : r.key, r.offset, r.offset + r.size,
                      file->size());
    }
    EncodedSample s;
    s.data = file->data() + r.offset;
    s.size = static_cast<size_t>(r.size);
    s.hold = std::shared_ptr<const void>(file, s.data);
    s.label = r.label;
    s.name = r.key.empty() ? fmt::format("{}#{}", path_, index) : urls_[r.shard] + ":" + r.key;
    if (boxes_.boxes) {
      if (r.packed.target_size > file->size() - r.offset - r.size) {
        throw bad_input("{}: sample {}'s target lies past the shard's {} bytes (its index is stale)", urls_[r.shard],
                        index, file->size());
      }
      attach_packed_target(&s, r.packed, file->data() + r.offset + r.size, s.name, boxes_.policy,
                           static_cast<int64_t>(classes_.size()));
    }
    return s;
  }
  bool has_boxes() const override { return boxes_.boxes; }
  std::vector<int64_t> category_ids() const override { return boxes_.category_ids; }
  bool image_size(int64_t index, int* width, int* height) const override {
    if (!boxes_.boxes) return false;
    const Record& r = records_.at(static_cast<size_t>(index));
    *width = static_cast<int>(r.packed.width);
    *height = static_cast<int>(r.packed.height);
    return true;
  }
  BoxCounts box_counts() const override { return boxes_.counts; }
  bool exif_orientation() const override { return boxes_.exif_orientation; }

  const std::vector<std::string>& classes() const override { return classes_; }

  std::string describe() const override {
    return fmt::format("{}: {} samples in {} remote shard{}{}", path_, records_.size(), urls_.size(),
                       urls_.size() == 1 ? "" : "s", note_.empty() ? "" : "; " + note_);
  }

  std::vector<int64_t> shard_counts() const override { return contiguous_shard_counts(records_, urls_.size()); }

  void plan(const std::vector<int64_t>& upcoming) const override {
    std::vector<int64_t> remaining(urls_.size(), 0);
    std::deque<uint32_t> queue;
    for (int64_t i : upcoming) {
      const uint32_t s = records_.at(static_cast<size_t>(i)).shard;
      if (remaining[s]++ == 0) queue.push_back(s);
    }
    std::vector<std::shared_ptr<const MappedFile>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
      remaining_ = std::move(remaining);
      queue_ = std::move(queue);
      for (size_t s = 0; s < pins_.size(); ++s) {  // keep what the new plan reads
        if (pins_[s] != nullptr && remaining_[s] == 0) {
          dropped.push_back(std::move(pins_[s]));
          --pinned_;
        }
      }
    }
    cv_.notify_all();
  }

  bool remote_io(RemoteIo* out) const override {
    const RemoteStats r = store_->stats();
    const CacheStats c = cache_->stats();
    out->requests = r.requests;
    out->retries = r.retries;
    out->bytes = r.bytes;
    out->downloads = c.downloads;
    out->hits = c.hits;
    out->evictions = c.evictions;
    out->failed_checks = c.failed_checks;
    out->cache_used_bytes = cache_->used_bytes();
    out->cache_max_bytes = cache_->max_bytes();
    out->cache_dir = cache_->dir();
    out->credentials = store_->credentials_source();
    return true;
  }

 private:
  // An I/O thread: fetches the next planned shard while fewer than ahead_ are pinned.
  void fetch_ahead() const {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && pinned_ + in_flight_ < ahead_); });
      if (stop_) return;
      const uint32_t s = queue_.front();
      queue_.pop_front();
      if (pins_[s] != nullptr || remaining_[s] == 0) continue;
      const uint64_t gen = generation_;
      ++in_flight_;
      lock.unlock();
      std::shared_ptr<const MappedFile> file;
      try {
        file = cache_->get(urls_[s], checks_[s]);
      } catch (const std::exception&) {
        // Not here: the reader's own get() of this shard meets the error again and reports it.
      }
      lock.lock();
      --in_flight_;
      if (file != nullptr && gen == generation_ && remaining_[s] > 0 && pins_[s] == nullptr) {
        pins_[s] = std::move(file);
        ++pinned_;
      }
      cv_.notify_all();
      if (file != nullptr) {  // not kept: unpin without holding the lock
        lock.unlock();
        file.reset();
        lock.lock();
      }
    }
  }

  std::string path_;
  std::shared_ptr<RemoteStore> store_;
  std::shared_ptr<ShardCache> cache_;
  std::vector<std::string> urls_;
  std::vector<ShardCheck> checks_;
  std::vector<Record> records_;
  std::vector<std::string> classes_;
  std::string note_;
  RemoteBoxes boxes_;
  int ahead_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::vector<std::shared_ptr<const MappedFile>> pins_;  // guarded by mu_: fetched ahead
  mutable std::vector<int64_t> remaining_;                       // guarded by mu_: planned reads left
  mutable std::deque<uint32_t> queue_;                           // guarded by mu_: shards to fetch
  mutable int pinned_ = 0, in_flight_ = 0;                       // guarded by mu_
  mutable uint64_t generation_ = 0;                              // guarded by mu_
  bool stop_ = false;                                            // guarded by mu_
  std::vector<std::thread> workers_;
};

std::vector<std::string> numbered_classes(int64_t max_label) {
  std::vector<std::string> out;
  for (int64_t i = 0; i <= max_label; ++i) out.push_back(std::to_string(i));
  return out;
}

constexpr const char* kAccepted =
    "accepted remote paths: tar shards (s3://bucket/train-{000000..000127}.tar, https://host/a.tar,https://host/b.tar) "
    "or a packed index (s3://bucket/set/index.crpk, or a URL ending in '/' that holds one)";

// What opening found: each shard's URL and check, the samples, the classes, a note for the log.
struct Opened {
  std::vector<std::string> urls;
  std::vector<ShardCheck> checks;
  std::vector<Record> records;
  std::vector<std::string> classes;
  std::string note;
  RemoteBoxes boxes;
};

// A packed set: its index.crpk, which records each shard's size and SHA-256 (older ones: the
// server's size and ETag).
Opened open_packed_index(const std::string& path, const RemoteStore& store, int threads) {
  Opened o;
  const std::string index_url = ends_with(path, "/") ? path + "index.crpk" : path;
  const std::string base = index_url.substr(0, index_url.find_last_of('/') + 1);
  const PackedIndex index = parse_packed_index(*store.read(index_url), index_url);
  o.classes = index.classes;
  o.urls.resize(index.shards.size());
  o.checks.resize(index.shards.size());
  for (size_t k = 0; k < index.shards.size(); ++k) o.urls[k] = base + index.shards[k];
  parallel_for(o.urls.size(), threads, [&](size_t k) {
    if (!index.shard_bytes.empty()) {
      o.checks[k].size = index.shard_bytes[k];
      o.checks[k].sha256 = index.shard_sha256.empty() ? "" : index.shard_sha256[k];
    } else {  // an index from before sizes were recorded: the server's word
      const ObjectInfo info = store.stat(o.urls[k]);
      o.checks[k].size = info.size;
      o.checks[k].md5 = info.md5();
    }
  });
  for (const auto& r : index.records) o.records.push_back({r.shard, r.offset, r.size, r.label, "", r});
  o.boxes.boxes = index.boxes;
  o.boxes.category_ids = index.category_ids;
  o.boxes.counts = index.box_counts;
  o.boxes.exif_orientation = index.exif_orientation;
  o.note = index.shard_sha256.empty() ? "sizes from the server" : "SHA-256 of each shard from the index";
  return o;
}

// Tar shards: each shard's ".idx" sidecar, or the shard itself downloaded and indexed.
Opened open_tar_list(const std::string& path, const RemoteStore& store, ShardCache& cache, int threads) {
  Opened o;
  o.urls = expand_shard_list(path);
  for (const auto& u : o.urls) {
    if (!is_remote_path(u) || !ends_with(u, ".tar")) {
      throw bad_input("{}: {} is not a remote .tar shard; {}", path, u, kAccepted);
    }
  }
  o.checks.resize(o.urls.size());
  std::vector<TarShardIndex> indexes(o.urls.size());
  std::atomic<int> from_sidecar{0}, by_download{0};
  parallel_for(o.urls.size(), threads, [&](size_t k) {
    // The size the server states (Content-Range's total), which every download must have; the
    // SHA-256 the sidecar records, else the MD5 of S3's ETag, which it must hash to.
    const ObjectInfo info = store.stat(o.urls[k]);
    o.checks[k].size = info.size;
    o.checks[k].md5 = info.md5();
    uint64_t size = 0;
    int64_t mtime = 0;
    std::string sha256;
    const auto sidecar = store.read(o.urls[k] + ".idx", /*missing_ok=*/true);
    if (sidecar && decode_tar_sidecar(*sidecar, &indexes[k], &size, &mtime, &sha256) && size == info.size) {
      o.checks[k].sha256 = sha256;
      ++from_sidecar;
      return;
    }
    const auto file = cache.get(o.urls[k], o.checks[k]);  // no usable sidecar: index the shard itself
    indexes[k] = index_tar_bytes(file->data(), file->size(), o.urls[k]);
    ++by_download;
  });
  std::vector<std::string> unhashed;
  int sha_checked = 0, md5_checked = 0;
  for (size_t k = 0; k < o.urls.size(); ++k) {
    if (!o.checks[k].sha256.empty()) {
      ++sha_checked;
    } else if (!o.checks[k].md5.empty()) {
      ++md5_checked;
    } else {
      unhashed.push_back(o.urls[k]);
    }
  }
  int64_t max_label = -1;
  for (size_t k = 0; k < o.urls.size(); ++k) {
    for (auto& m : indexes[k].samples) {
      if (m.target_size > 0) {
        throw bad_input("{}: sample {} carries a detection target (.json with \"boxes\"); detection sets are read "
                        "remotely as packed sets: `crucible pack` the shards and read the packed index",
                        o.urls[k], m.key);
      }
      max_label = std::max(max_label, m.label);
      o.records.push_back({static_cast<uint32_t>(k), m.offset, m.size, m.label, std::move(m.key)});
    }
  }
  o.classes = numbered_classes(max_label);
  o.note = fmt::format("offset indexes: {} from .idx, {} by downloading the shard; checked by size and SHA-256 from "
                       ".idx: {}, by size and MD5 from the ETag: {}, by size only: {}",
                       from_sidecar.load(), by_download.load(), sha_checked, md5_checked, unhashed.size());
  if (!unhashed.empty()) {
    std::string names;
    for (size_t k = 0; k < unhashed.size() && k < 8; ++k) names += (k > 0 ? ", " : "") + unhashed[k];
    if (unhashed.size() > 8) names += fmt::format(" and {} more", unhashed.size() - 8);
    log_warn("{}: {} of {} shards are checked by size only, not hashed: no .idx with a SHA-256 beside them and no "
             "MD5 ETag ({}); upload the <shard>.idx that opening a local shard writes",
             path, unhashed.size(), o.urls.size(), names);
  }
  if (by_download > 0) {
    log_warn("{}: {} of {} shards have no usable .idx beside them and were downloaded at open to be indexed; "
             "upload the <shard>.idx that opening a local shard writes",
             path, by_download.load(), o.urls.size());
  }
  return o;
}

}  // namespace

int shards_read_ahead(const RemoteSourceOptions& options, int64_t shards, uint64_t largest) {
  const int io = std::max(1, options.io_threads);
  const int want = options.ahead_shards > 0 ? options.ahead_shards : io + 1;
  const std::string why = options.ahead_why.empty() ? "data.io_threads + 1" : options.ahead_why;
  const auto cap = [&](int64_t n) { return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n, shards))); };
  const int ahead = cap(want);
  const int least = cap(options.least_ahead_shards > 0 ? std::min(options.least_ahead_shards, want) : want);
  const auto budget = static_cast<uint64_t>(std::max<int64_t>(0, options.cache_bytes));
  if (largest == 0 || largest * static_cast<uint64_t>(ahead) <= budget) return ahead;
  const auto fits = static_cast<int>(std::min<uint64_t>(budget / largest, static_cast<uint64_t>(ahead)));
  if (fits < least) {
    throw bad_input("data.cache_bytes = {} holds {} shard(s) of up to {} bytes; reading needs {} at least ({}) and "
                    "reads best with {}: raise it to at least {} (best {})",
                    options.cache_bytes, fits, largest, least, why, ahead, largest * static_cast<uint64_t>(least),
                    largest * static_cast<uint64_t>(ahead));
  }
  log_warn("data.cache_bytes = {} holds {} of the {} shards of up to {} bytes that reading ahead wants ({}): the rest "
           "are fetched when they are read, and decoding waits for them. Raise data.cache_bytes to {} to fetch all "
           "of them ahead",
           options.cache_bytes, fits, ahead, largest, why, largest * static_cast<uint64_t>(ahead));
  return fits;
}

std::unique_ptr<SampleSource> open_remote_samples(const std::string& path, const RemoteSourceOptions& options) {
  if (options.cache_dir.empty()) throw bad_input("{}: remote data needs data.cache_dir, a folder on this node", path);
  auto store = std::make_shared<RemoteStore>(options.remote);
  auto cache = std::make_shared<ShardCache>(
      options.cache_dir, options.cache_bytes,
      [store](const std::string& url, uint64_t size, int fd) { return store->download(url, size, fd); },
      [store](const std::string& url) { return store->stat(url).size; }, options.remote.tries);
  const int threads = std::max(1, options.io_threads);

  Opened o = ends_with(path, "/") || ends_with(path, "index.crpk") ? open_packed_index(path, *store, threads)
                                                                    : open_tar_list(path, *store, *cache, threads);
  o.boxes.policy = options.boxes;
  uint64_t largest = 0;
  for (const auto& c : o.checks) largest = std::max(largest, c.size);
  RemoteSourceOptions fitted = options;
  fitted.ahead_shards = shards_read_ahead(options, static_cast<int64_t>(o.urls.size()), largest);
  return std::make_unique<RemoteShardSource>(path, fitted, std::move(store), std::move(cache), std::move(o.urls),
                                             std::move(o.checks), std::move(o.records), std::move(o.classes),
                                             std::move(o.note), std::move(o.boxes));
}

}  // namespace crucible::data
