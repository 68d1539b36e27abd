// The node's cache of remote shards (issue 37): a folder (data.cache_dir) that never holds more
// than data.cache_bytes, shared by every process of the node — each shard is downloaded once
// while it is cached, whichever rank asks first.
//
// - A shard is downloaded into "<name>.part-<pid>", checked (size, then the SHA-256 or MD5 the
//   caller knows) and only then renamed into place: a file that failed its check is deleted,
//   never used, and a crashed download leaves a part file the next process removes.
// - Space is reserved before a download, under an flock of "<dir>/.lock" that every process
//   takes; what does not fit evicts the least recently used shards nobody has pinned.
// - A pin is a shared flock on the shard file, held while any sample of it is in use (in this
//   or another process): eviction takes an exclusive one without waiting, so it never removes
//   a pinned shard.
// - One download per shard per node: "<name>.lock" is held (exclusively) while it downloads.
// Thread-safe; torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "crucible/core/mmap.h"

namespace crucible::data {

// What a downloaded shard must be. size 0: whatever the server says (then only the length of
// what arrived is checked against its headers).
struct ShardCheck {
  uint64_t size = 0;
  std::string sha256;  // hex; empty: not known
  std::string md5;     // hex; empty: not known
};

struct CacheStats {
  int64_t hits = 0;         // shards found in the folder
  int64_t downloads = 0;    // shards downloaded
  int64_t bytes = 0;        // bytes downloaded
  int64_t evictions = 0;    // shards removed to make room
  int64_t failed_checks = 0;  // downloads deleted for a wrong size or checksum
};

class ShardCache {
 public:
  // Fills the file `fd` (already `size` bytes long: the reservation) with the shard behind `url`
  // and returns the bytes it wrote; throws what the store throws.
  using Fetch = std::function<uint64_t(const std::string& url, uint64_t size, int fd)>;
  // The shard's size when the caller does not know it.
  using Stat = std::function<uint64_t(const std::string& url)>;

  // Creates `dir` when missing. bad_input when max_bytes < 1 or the folder cannot be made.
  ShardCache(std::string dir, int64_t max_bytes, Fetch fetch, Stat stat, int tries = 3);
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  // The shard, mapped and pinned until the last copy of the pointer goes: from the folder when
  // there, else downloaded (waiting for room while every shard is pinned, at most `wait_s`).
  // bad_input when the shard alone is larger than the cache; runtime_error when its downloads
  // keep failing their check (`tries` of them; this process then gives the same error for the
  // shard at once, never downloading it again), or no room came in time.
  std::shared_ptr<const MappedFile> get(const std::string& url, const ShardCheck& check);

  // Bytes the folder's files hold now (the sum of their sizes; part files included).
  int64_t used_bytes() const;
  int64_t max_bytes() const { return max_bytes_; }
  const std::string& dir() const { return dir_; }
  CacheStats stats() const;
  // Seconds get() waits for room before giving up (tests shorten it).
  void set_wait_seconds(double s) { wait_s_ = s; }

  // A test seam: called, on the thread that gets there, at the points where the interleaving of
  // threads or processes matters: "listed" (a reservation, holding the folder's lock, has read
  // the folder's names and not yet their sizes), "waiting for the folder lock" (another holds
  // it), "renamed" (a checked download is in place). Set it before the first get().
  using TestHook = std::function<void(const char* point)>;
  void set_test_hook(TestHook hook) { test_hook_ = std::move(hook); }

  // The file name a URL is cached under: a hash of the URL and its last part, readable in `ls`.
  static std::string file_name(const std::string& url);

 private:
  struct Pinned;
  std::shared_ptr<const MappedFile> pin_existing(const std::string& path);
  void reserve(uint64_t size, const std::string& part_path, const std::string& url);
  void download(const std::string& url, const std::string& path, uint64_t size, const ShardCheck& check);
  // The folder's "<dir>/.lock", held exclusively until the returned descriptor is closed.
  int lock_folder() const;

  std::string dir_;
  int64_t max_bytes_;
  Fetch fetch_;
  Stat stat_;
  int tries_;
  double wait_s_ = 600;
  TestHook test_hook_;
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<const MappedFile>> open_;  // guarded by mu_: this process's pins
  std::map<std::string, std::string> failed_;  // guarded by mu_: URL → why its downloads failed their check
  std::atomic<int64_t> hits_{0}, downloads_{0}, bytes_{0}, evictions_{0}, failed_checks_{0};
};

}  // namespace crucible::data
