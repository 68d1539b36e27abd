// The node's shard cache (shard_cache.h): flock-coordinated reservation, LRU eviction of
// unpinned shards, checked downloads renamed into place.
#include "crucible/data/remote/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/sha256.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPart = ".part-";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file descriptor closed on scope exit (its flock goes with it).
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_or_throw(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) throw runtime_error("shard cache: cannot open {}: {}", path, errno_text(errno));
  return fd;
}

void lock_or_throw(int fd, int op, const std::string& path) {
  while (::flock(fd, op) != 0) {
    if (errno != EINTR) throw runtime_error("shard cache: cannot lock {}: {}", path, errno_text(errno));
  }
}

// Hex digest of the file's bytes: "sha256" or "md5".
std::string file_digest(int fd, uint64_t size, const char* algorithm) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_get_digestbyname(algorithm), nullptr);
  std::vector<char> buf(size_t{4} << 20);
  uint64_t at = 0;
  while (at < size) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      EVP_MD_CTX_free(ctx);
      throw runtime_error("shard cache: cannot read back a download: {}", n < 0 ? errno_text(errno) : "short file");
    }
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  return to_hex(md, len);
}

// Why a finished download of `wrote` bytes in `fd` fails `check` ("" when it passes): its size,
// then the SHA-256 the .idx records, else the MD5 of S3's ETag (each file read once).
std::string check_failure(int fd, uint64_t wrote, uint64_t size, const ShardCheck& check) {
  struct stat st {};
  if (wrote != size || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    return fmt::format("{} bytes where {} were expected", wrote, size);
  }
  if (!check.sha256.empty()) {
    const std::string got = file_digest(fd, size, "sha256");
    return got == check.sha256 ? "" : fmt::format("SHA-256 {} where the index says {}", got, check.sha256);
  }
  if (!check.md5.empty()) {
    const std::string got = file_digest(fd, size, "md5");
    return got == check.md5 ? "" : fmt::format("MD5 {} where the ETag says {}", got, check.md5);
  }
  return "";
}

// A part file whose writer is gone ("<name>.part-<pid>-<n>" with no process <pid>).
bool is_stale_part(const std::string& name) {
  const size_t at = name.rfind(kPart);
  if (at == std::string::npos) return false;
  const long pid = std::strtol(name.c_str() + at + std::strlen(kPart), nullptr, 10);
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

struct Entry {
  std::string path;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool complete = false;  // a cached shard (not a part file, not a lock file)
};

// The folder's files: their names first, then (after `named`, a test seam) their sizes. A file
// renamed in between is missed under both names, so a reservation lists under the folder's lock
// and renames take it too.
std::vector<Entry> list_entries(const std::string& dir, const std::function<void()>& named = nullptr) {
  std::vector<Entry> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw runtime_error("shard cache: cannot list {}: {}", dir, errno_text(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  if (named) named();
  for (const std::string& name : names) {
    struct stat st {};
    const std::string path = dir + "/" + name;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    Entry x;
    x.path = path;
    x.size = st.st_size;
    x.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    x.complete = name[0] != '.' && name.find(kPart) == std::string::npos && !ends_with(name, ".lock");
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

// A pinned shard: the mapping and the descriptor whose shared flock is the pin.
struct ShardCache::Pinned {
  std::shared_ptr<const MappedFile> file;
  int fd = -1;
  ~Pinned() {
    if (fd >= 0) ::close(fd);
  }
};

ShardCache::ShardCache(std::string dir, int64_t max_bytes, Fetch fetch, Stat stat, int tries)
    : dir_(std::move(dir)), max_bytes_(max_bytes), fetch_(std::move(fetch)), stat_(std::move(stat)), tries_(tries) {
  if (max_bytes_ < 1) throw bad_input("data.cache_bytes should be positive, found {}", max_bytes_);
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    throw bad_input("data.cache_dir {}: cannot make the folder: {}", dir_, ec ? ec.message() : "not a folder");
  }
  if (::access(dir_.c_str(), W_OK) != 0) throw bad_input("data.cache_dir {}: not writable: {}", dir_, errno_text(errno));
}

std::string ShardCache::file_name(const std::string& url) {
  std::string last = url.substr(url.find_last_of('/') + 1);
  for (char& c : last) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (last.size() > 80) last = last.substr(last.size() - 80);
  if (last.empty() || last[0] == '.') last = "_" + last;
  return sha256_hex(url).substr(0, 16) + "-" + last;
}

int64_t ShardCache::used_bytes() const {
  int64_t total = 0;
  for (const auto& e : list_entries(dir_)) total += e.size;
  return total;
}

CacheStats ShardCache::stats() const {
  return {hits_.load(), downloads_.load(), bytes_.load(), evictions_.load(), failed_checks_.load()};
}

// Pins the shard at `path` when it is there; null when it is not.
std::shared_ptr<const MappedFile> ShardCache::pin_existing(const std::string& path) {
  for (int round = 0; round < 3; ++round) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return nullptr;
      throw runtime_error("shard cache: cannot open {}: {}", path, errno_text(errno));
    }
    auto pinned = std::make_shared<Pinned>();
    pinned->fd = fd;
    lock_or_throw(fd, LOCK_SH, path);
    // Evicted between open and flock: the name is gone or names another file now.
    struct stat a {}, b {};
    if (::fstat(fd, &a) != 0 || ::stat(path.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) continue;
    ::futimens(fd, nullptr);  // recently used: evicted last
    pinned->file = MappedFile::open(path);
    return std::shared_ptr<const MappedFile>(pinned, pinned->file.get());
  }
  return nullptr;
}

int ShardCache::lock_folder() const {
  const std::string lock_path = dir_ + "/.lock";
  Fd lock(open_or_throw(lock_path, O_RDWR | O_CREAT));
  if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      throw runtime_error("shard cache: cannot lock {}: {}", lock_path, errno_text(errno));
    }
    if (errno == EWOULDBLOCK && test_hook_) test_hook_("waiting for the folder lock");
    lock_or_throw(lock.fd, LOCK_EX, lock_path);
  }
  const int fd = lock.fd;
  lock.fd = -1;
  return fd;
}

void ShardCache::reserve(uint64_t size, const std::string& part_path, const std::string& url) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s_);
  for (bool first = true;; first = false) {
    if (!first) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // for a pin to go
    Fd lock(lock_folder());
    std::vector<Entry> entries = list_entries(dir_, [this] {
      if (test_hook_) test_hook_("listed");
    });
    int64_t used = 0;
    for (const auto& e : entries) {
      if (!e.complete && e.path.find(kPart) != std::string::npos && is_stale_part(e.path)) {
        ::unlink(e.path.c_str());
        continue;
      }
      used += e.size;
    }
    const auto need = static_cast<int64_t>(size);
    if (used + need > max_bytes_) {
      std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) { return x.mtime_ns < y.mtime_ns; });
      for (const auto& e : entries) {
        if (used + need <= max_bytes_) break;
        if (!e.complete) continue;
        Fd fd(::open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.fd < 0 || ::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) continue;  // pinned by someone
        if (::unlink(e.path.c_str()) == 0) {
          used -= e.size;
          evictions_.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    if (used + need <= max_bytes_) {
      Fd part(open_or_throw(part_path, O_RDWR | O_CREAT | O_EXCL));
      // The reservation, counted from now on: the blocks themselves (a full disk says so here,
      // not halfway through a download; and ext4 maps the written pages faster into allocated
      // blocks), or the size alone where the file system cannot allocate ahead.
      int e = ::fallocate(part.fd, 0, 0, static_cast<off_t>(size)) == 0 ? 0 : errno;
      if (e != 0 && e != ENOSPC && e != EDQUOT) e = ::ftruncate(part.fd, static_cast<off_t>(size)) == 0 ? 0 : errno;
      if (e != 0) {
        ::unlink(part_path.c_str());
        struct statvfs fs {};
        const int64_t free_bytes = ::statvfs(dir_.c_str(), &fs) == 0 ? static_cast<int64_t>(fs.f_bavail * fs.f_frsize) : -1;
        throw runtime_error("data.cache_dir {}: cannot reserve {} bytes for {}: {} ({} bytes free on its file system). "
                            "Free space there, or lower data.cache_bytes (now {}) to what the disk holds",
                            dir_, size, url, errno_text(e), free_bytes, max_bytes_);
      }
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw runtime_error(
          "data.cache_dir {}: no room for {} ({} bytes) in data.cache_bytes = {} after {:.0f} s: {} bytes are held by "
          "shards in use. Raise data.cache_bytes or lower data.shuffle_window",
          dir_, url, size, max_bytes_, wait_s_, used);
    }
  }
}

void ShardCache::download(const std::string& url, const std::string& path, uint64_t size, const ShardCheck& check) {
  static std::atomic<uint64_t> counter{0};
  std::string last;
  for (int attempt = 1; attempt <= std::max(1, tries_); ++attempt) {
    const std::string part = path + kPart + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    reserve(size, part, url);
    try {
      Fd fd(open_or_throw(part, O_RDWR));
      last = check_failure(fd.fd, fetch_(url, size, fd.fd), size, check);
      if (last.empty()) {
        {
          // Under the folder's lock, as reservations list it: a listing that raced a rename saw
          // neither the part (gone when stat'ed) nor the shard (added behind the read), so it
          // counted one shard too few and let the folder hold one more than data.cache_bytes
          // (seen once in CI: 675,840 of 563,200 bytes; ShardCache.ARenameDuringAListingIsCounted).
          Fd lock(lock_folder());
          if (::rename(part.c_str(), path.c_str()) != 0) {
            throw runtime_error("shard cache: cannot rename {} to {}: {}", part, path, errno_text(errno));
          }
        }
        if (test_hook_) test_hook_("renamed");
        downloads_.fetch_add(1, std::memory_order_relaxed);
        bytes_.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
        return;
      }
    } catch (...) {
      ::unlink(part.c_str());
      throw;
    }
    ::unlink(part.c_str());  // failed its check: never used, never kept
    failed_checks_.fetch_add(1, std::memory_order_relaxed);
    log_warn("{}: the download has {} (try {} of {}); deleted", url, last, attempt, tries_);
  }
  const std::string why = fmt::format("{}: {} downloads failed their check; the last had {}", url, tries_, last);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[url] = why;
  }
  throw runtime_error("{}", why);
}

std::shared_ptr<const MappedFile> ShardCache::get(const std::string& url, const ShardCheck& check) {
  const std::string path = dir_ + "/" + file_name(url);
  auto failed_before = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failed_.find(url);
    if (it != failed_.end()) throw runtime_error("{}", it->second);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(path);
    if (it != open_.end()) {
      if (auto held = it->second.lock()) return held;  // mapped here already: not counted
    }
  }
  failed_before();
  auto remember = [&](std::shared_ptr<const MappedFile> f) {
    std::lock_guard<std::mutex> lock(mu_);
    open_[path] = f;
    return f;
  };
  auto usable = [&](const std::shared_ptr<const MappedFile>& f) {
    return f != nullptr && (check.size == 0 || f->size() == check.size);
  };
  if (auto f = pin_existing(path); usable(f)) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return remember(f);
  }
  // One download per node: whoever holds "<name>.lock" downloads; the others wait, then find it.
  const std::string lock_path = path + ".lock";
  Fd lock(open_or_throw(lock_path, O_RDWR | O_CREAT));
  lock_or_throw(lock.fd, LOCK_EX, lock_path);
  if (auto f = pin_existing(path)) {
    if (usable(f)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return remember(f);
    }
    // A cached file of another size (the object changed): replaced when nobody reads it.
    log_warn("shard cache: {} holds {} bytes but {} has {}; downloading it again", path, f->size(), url, check.size);
  }
  failed_before();  // while this thread waited for the lock, another's downloads failed
  const uint64_t size = check.size > 0 ? check.size : stat_(url);
  if (size > static_cast<uint64_t>(max_bytes_)) {
    throw bad_input("data.cache_bytes = {} cannot hold {} ({} bytes): raise it above the largest shard", max_bytes_,
                    url, size);
  }
  download(url, path, size, check);
  auto f = pin_existing(path);
  if (f == nullptr) throw runtime_error("shard cache: {} vanished after its download", path);
  return remember(f);
}

}  // namespace crucible::data
