// Sample sources and pack (D1, D5, D6, D11): image folders against torchvision's ImageFolder,
// tar shards against Python's tarfile, LMDB and packed shards round trips, corrupt inputs, the
// descriptors each source really uses (D6), and the evenly spaced subset behind
// data.train_samples / data.test_samples. To add a case: build the data in a test::TempDir
// (Python/PIL for real images), open it with the source under test and compare bytes/labels
// with what Python or the writer produced; for a new source also call expect_declared_descriptors.
#include "crucible/data/formats/sample_source.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/data/image/decode.h"
#include "crucible/data/formats/pack.h"
#include "crucible/data/formats/shard_index.h"
#include "crucible/io/idx.h"
#include "crucible/data/data_setup.h"
#include "test_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string bytes_of(const EncodedSample& s) { return std::string(reinterpret_cast<const char*>(s.data), s.size); }

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[at + i]);
  return v;
}

// Python helpers: deterministic random images encoded by PIL, and file writing.
const std::string kPyImages = R"(
import io, os, json, tarfile
import numpy as np
from PIL import Image
def pixels(w, h, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
def encode(a, fmt):
    b = io.BytesIO(); Image.fromarray(a).save(b, format=fmt); return b.getvalue()
def image(w, h, seed, fmt):
    return encode(pixels(w, h, seed), fmt)
def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f: f.write(data)
)";

// A small image folder of arbitrary bytes (no decoding needed): 3 classes, 3-4 files each.
void make_byte_folder(const std::string& root) {
  int n = 0;
  for (const char* cls : {"ant", "bee", "cow"}) {
    fs::create_directories(root + "/" + cls);
    for (int i = 0; i < 3 + (cls[0] == 'b'); ++i, ++n) {
      test::write_text(root + "/" + cls + "/f" + std::to_string(i) + ".jpg",
                       std::string(static_cast<size_t>(100 + 937 * n % 5000), static_cast<char>('a' + n)));
    }
  }
}

// ---- D6: descriptors as declared ------------------------------------------------------------

// The descriptor numbers open in this process now (the listing's own left out), ascending.
std::vector<int> open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) throw std::runtime_error(std::string("cannot list /proc/self/fd: ") + std::strerror(errno));
  const int own = ::dirfd(dir);
  std::vector<int> fds;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != own) fds.push_back(fd);
  }
  ::closedir(dir);
  std::sort(fds.begin(), fds.end());
  return fds;
}

#if defined(CRUCIBLE_SANITIZED)
// Sanitizer runtimes open descriptors of their own while checking a pointer (UBSan's vptr check
// probes memory through a pipe), so a process left without a spare descriptor reports false
// errors: the sanitizer builds count descriptors but do not starve them.
constexpr bool kCanStarveDescriptors = false;
#else
constexpr bool kCanStarveDescriptors = true;
#endif

// Lowers the soft RLIMIT_NOFILE until destruction so that exactly `free` descriptor numbers
// below it are unused: open() takes the lowest unused number and fails with EMFILE when that is
// at or above the limit, so `free` more files can be open at once, and no more.
class FreeDescriptors {
 public:
  explicit FreeDescriptors(int free) {
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) throw std::runtime_error("getrlimit failed");
    const std::vector<int> used = open_fds();
    rlim_t limit = 0;
    int unused = 0;
    size_t k = 0;
    for (int n = 0;; ++n) {  // the limit is the (free + 1)-th unused number
      if (k < used.size() && used[k] == n) {
        ++k;
      } else if (unused++ == free) {
        limit = static_cast<rlim_t>(n);
        break;
      }
    }
    struct rlimit lowered = saved_;
    lowered.rlim_cur = limit;
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) throw std::runtime_error("setrlimit failed");
  }
  ~FreeDescriptors() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  FreeDescriptors(const FreeDescriptors&) = delete;
  FreeDescriptors& operator=(const FreeDescriptors&) = delete;

 private:
  struct rlimit saved_ {};
};

// Reads sample `index` of `src` with exactly `free` descriptors to spare: "" when it succeeds
// with the bytes of `want`, else what went wrong.
std::string get_with_free_descriptors(const SampleSource& src, int64_t index, int free, const std::string& want) {
  std::string outcome;
  {
    FreeDescriptors limit(free);  // nothing but get() may open a file in this scope
    try {
      const EncodedSample s = src.get(index);
      if (bytes_of(s) != want) outcome = "get() returned other bytes";
    } catch (const Error& e) {
      outcome = e.what();
    }
  }
  return outcome;
}

// D6: the loader sizes `ulimit -n` from files_held() and files_per_read(), so they must be what
// the source does. Opening it keeps files_held() descriptors; get(`index`) leaves none behind,
// works with files_per_read() descriptors to spare and, when it opens any, fails naming the
// sample's file with one fewer.
void expect_declared_descriptors(const std::function<std::unique_ptr<SampleSource>()>& open, int64_t index) {
  const size_t before = open_fds().size();
  const std::unique_ptr<SampleSource> src = open();
  const size_t after_open = open_fds().size();
  EXPECT_EQ(static_cast<int64_t>(after_open) - static_cast<int64_t>(before), src->files_held())
      << "descriptors held by " << src->describe();
  const EncodedSample want = src->get(index);
  EXPECT_EQ(open_fds().size(), after_open) << "get(" << index << ") left descriptors open: " << src->describe();
  const int per_read = src->files_per_read();
  if (!kCanStarveDescriptors) return;
  EXPECT_EQ(get_with_free_descriptors(*src, index, per_read, bytes_of(want)), "")
      << "get(" << index << ") with " << per_read << " descriptors free: " << src->describe();
  if (per_read >= 1) {
    const std::string error = get_with_free_descriptors(*src, index, per_read - 1, bytes_of(want));
    EXPECT_NE(error, "") << "get(" << index << ") succeeded with " << per_read - 1 << " descriptors free, so "
                         << "files_per_read() = " << per_read << " is more than it needs: " << src->describe();
    if (!error.empty()) {
      EXPECT_NE(error.find(want.name), std::string::npos) << error;
    }
  }
  EXPECT_EQ(open_fds().size(), after_open) << "the descriptor limit was not restored cleanly";
}

// ---- image folder ---------------------------------------------------------------------------

TEST(ImageFolderSource, LabelsAndOrderEqualTorchvision) {
  test::TempDir d;
  const std::string root = d / "tree";
  // Byte order differs from locale order ("Zeta" < "alpha", "B.png" < "_c" < "a.JPG"), and
  // torchvision orders folders by their whole path ("sub-dir" before "sub/deeper").
  const std::string out = test::run_python(kPyImages + "root = '" + root + "'\n" + R"(
files = ['alpha/b.JPG', 'alpha/B.png', 'alpha/_c.jpeg', 'alpha/a.Png', 'alpha/notes.txt', 'alpha/x.jpg.bak',
         'alpha/sub/x.jpg', 'alpha/sub-dir/y.png', 'alpha/sub/deeper/z.PNG', 'alpha/sub/deeper/readme',
         'Zeta/\u00e9.png', 'Zeta/z.png', 'Zeta/Q.TIFF', 'Zeta/w.webp',
         'beta/one.bmp', 'beta/deep/er/two.ppm', 'beta/three.pgm', 'beta/four.tif', 'beta/five.gif']
for i, f in enumerate(files):
    write(os.path.join(root, f), bytes([i]) * (10 + i))
write(os.path.join(root, 'top-level-file.jpg'), b'ignored')
from torchvision import datasets
ds = datasets.ImageFolder(root, loader=lambda p: p)
print(json.dumps({'classes': ds.classes, 'samples': ds.samples}))
)");
  const json want = json::parse(out);
  auto src = open_image_folder(root + "/");  // a trailing slash changes nothing
  EXPECT_EQ(src->classes(), want["classes"].get<std::vector<std::string>>());
  ASSERT_EQ(src->size(), static_cast<int64_t>(want["samples"].size()));
  for (int64_t i = 0; i < src->size(); ++i) {
    const EncodedSample s = src->get(i);
    EXPECT_EQ(s.name, want["samples"][i][0].get<std::string>()) << i;
    EXPECT_EQ(s.label, want["samples"][i][1].get<int64_t>()) << i;
    EXPECT_EQ(bytes_of(s), test::read_text(s.name)) << i;
  }
  EXPECT_EQ(src->files_per_read(), 1);  // D6: get() opens, reads and closes the file
  EXPECT_EQ(src->files_held(), 0);
  expect_declared_descriptors([&] { return open_image_folder(root); }, src->size() - 1);
  EXPECT_NE(src->describe().find("3 classes"), std::string::npos) << src->describe();
}

TEST(ImageFolderSource, EmptyOrClasslessFoldersAreBadInput) {
  test::TempDir d;
  fs::create_directories(d / "empty");
  test::expect_bad_input([&] { open_image_folder(d / "empty"); }, {"empty", "empty"});
  fs::create_directories(d / "flat");
  test::write_text(d / "flat/a.jpg", "x");
  test::expect_bad_input([&] { open_image_folder(d / "flat"); }, {"flat", "no class sub-folders"});
  fs::create_directories(d / "partial/a");
  fs::create_directories(d / "partial/b");
  test::write_text(d / "partial/a/x.png", "x");
  test::write_text(d / "partial/b/x.txt", "x");
  test::expect_bad_input([&] { open_image_folder(d / "partial"); }, {"partial", "no image file", " b;"});
  test::expect_bad_input([&] { open_image_folder(d / "missing"); }, {"missing", "does not exist"});
}

TEST(ImageFolderSource, MissingFileNamesThePath) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto src = open_image_folder(d / "f");
  fs::remove(d / "f/bee/f2.jpg");
  test::expect_bad_input([&] { src->get(5); }, {"bee/f2.jpg"});
}

// ---- tar shards -----------------------------------------------------------------------------

const std::string kPyTar = R"(
def blob(key, n):
    return bytes((i * 7 + len(key) * 13) % 256 for i in range(n))
def add(t, name, data=b'', kind=tarfile.REGTYPE):
    ti = tarfile.TarInfo(name); ti.type = kind
    if kind == tarfile.REGTYPE:
        ti.size = len(data); t.addfile(ti, io.BytesIO(data))
    else:
        if kind == tarfile.SYMTYPE: ti.linkname = 'elsewhere'
        t.addfile(ti)
)";

// The WebDataset shard of most tar tests; prints [[key, hex bytes, label], ...] as JSON.
std::string webdataset_shard_script(const std::string& path, const std::string& format, int extra = 0) {
  return kPyImages + kPyTar + "path = '" + path + "'\nfmt = tarfile." + format + "\nextra = " + std::to_string(extra) +
         R"(
long = 'L' * 110 + '/s003'
want = []
with tarfile.open(path, 'w', format=fmt) as t:
    add(t, 'data.v1', kind=tarfile.DIRTYPE)
    add(t, 'data.v1/s001.jpg', blob('a', 1000)); add(t, 'data.v1/s001.cls', b'3\n')
    want.append(['data.v1/s001', blob('a', 1000).hex(), 3])
    add(t, 'data.v1/s002.png', blob('bb', 513))                     # no label: -1
    want.append(['data.v1/s002', blob('bb', 513).hex(), -1])
    add(t, long + '.jpg', blob('c', 512)); add(t, long + '.label.txt', b' 7 \n')
    want.append([long, blob('c', 512).hex(), 7])
    add(t, 'README')                                                 # no extension: ignored
    add(t, 'd/s004.left.jpg', blob('dd', 20)); add(t, 'd/s004.right.jpg', blob('ddd', 30))
    add(t, 'd/s004.cls', b'1')
    want.append(['d/s004', blob('dd', 20).hex(), 1])
    add(t, 'd/s005.txt', b'no image'); add(t, 'd/s005.cls', b'4')   # skipped: no image
    add(t, 'd/link.jpg', kind=tarfile.SYMTYPE)                       # not a regular file
    add(t, 's006.JPEG', blob('eeeee', 77)); add(t, 's006.label', b'2')
    want.append(['s006', blob('eeeee', 77).hex(), 2])
    for i in range(extra):
        add(t, 'x%d.png' % i, blob('x' * i, 100 + i)); add(t, 'x%d.cls' % i, b'%d' % i)
        want.append(['x%d' % i, blob('x' * i, 100 + i).hex(), i])
print(json.dumps(want))
)";
}

void expect_samples(const SampleSource& src, const std::string& shard, const json& want) {
  ASSERT_EQ(src.size(), static_cast<int64_t>(want.size())) << src.describe();
  for (int64_t i = 0; i < src.size(); ++i) {
    const EncodedSample s = src.get(i);
    EXPECT_EQ(s.name, shard + ":" + want[i][0].get<std::string>());
    EXPECT_EQ(bytes_of(s), unhex(want[i][1].get<std::string>())) << s.name;
    EXPECT_EQ(s.label, want[i][2].get<int64_t>()) << s.name;
  }
}

TEST(TarShardSource, GnuLongNamesLabelsAndBytesEqualPython) {
  test::TempDir d;
  const std::string shard = d / "train-000000.tar";
  const json want = json::parse(test::run_python(webdataset_shard_script(shard, "GNU_FORMAT")));
  auto src = open_tar_shards({shard});
  expect_samples(*src, shard, want);
  EXPECT_EQ(src->classes(), (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7"}));
  EXPECT_NE(src->describe().find("1 skipped without an image"), std::string::npos) << src->describe();
  EXPECT_EQ(src->files_held(), 0);  // D6: the shard is mapped, its descriptor closed
  EXPECT_EQ(src->files_per_read(), 0);
  expect_declared_descriptors([&] { return open_tar_shards({shard}); }, 2);
}

TEST(TarShardSource, PaxHeadersAndUstarPrefixEqualPython) {
  test::TempDir d;
  for (const char* format : {"PAX_FORMAT", "USTAR_FORMAT"}) {
    const std::string shard = d / (std::string(format) + ".tar");
    // pax: an 'x' header holds the long path; ustar: the path is split over prefix + name.
    const json want = json::parse(test::run_python(webdataset_shard_script(shard, format)));
    expect_samples(*open_tar_shards({shard}), shard, want);
  }
}

TEST(TarShardSource, SidecarIndexIsWrittenReusedAndRebuilt) {
  test::TempDir d;
  const std::string shard = d / "s.tar";
  test::run_python(webdataset_shard_script(shard, "GNU_FORMAT"));
  auto first = open_tar_shards({shard});
  ASSERT_TRUE(fs::exists(shard + ".idx"));
  EXPECT_NE(first->describe().find("0 read from .idx, 1 built"), std::string::npos) << first->describe();

  const json want = json::parse(test::run_python(webdataset_shard_script(d / "other.tar", "GNU_FORMAT")));
  auto second = open_tar_shards({shard});
  EXPECT_NE(second->describe().find("1 read from .idx, 0 built"), std::string::npos) << second->describe();
  expect_samples(*second, shard, want);

  // A changed shard (different size and mtime) → the stale index is ignored and rewritten.
  const json more = json::parse(test::run_python(webdataset_shard_script(shard, "GNU_FORMAT", 3)));
  auto third = open_tar_shards({shard});
  EXPECT_NE(third->describe().find("0 read from .idx, 1 built"), std::string::npos) << third->describe();
  expect_samples(*third, shard, more);
  EXPECT_NE(open_tar_shards({shard})->describe().find("1 read from .idx"), std::string::npos);

  // A damaged index (CRC) is rebuilt, never trusted.
  std::string idx = test::read_text(shard + ".idx");
  idx[50] = static_cast<char>(idx[50] ^ 0x55);
  test::write_text(shard + ".idx", idx);
  auto fourth = open_tar_shards({shard});
  EXPECT_NE(fourth->describe().find("1 built"), std::string::npos) << fourth->describe();
  expect_samples(*fourth, shard, more);

  // A read-only folder: no index can be written, the shard still opens.
  if (::geteuid() != 0) {
    fs::create_directories(d / "ro");
    fs::copy_file(shard, d / "ro/s.tar");
    ::chmod((d / "ro").c_str(), 0555);
    auto ro = open_tar_shards({d / "ro/s.tar"});
    EXPECT_EQ(ro->size(), static_cast<int64_t>(more.size()));
    EXPECT_FALSE(fs::exists(d / "ro/s.tar.idx"));
    ::chmod((d / "ro").c_str(), 0755);
  }
}

// The .idx records the shard's SHA-256, what a remote copy of the shard is verified by (Python's
// hashlib the oracle). One written before the hash was recorded ("CRTARIX1") still reads, and
// opening the shard gives it the hash, once.
TEST(TarShardSource, SidecarRecordsTheShardsSha256AndAnOldOneIsGivenIt) {
  test::TempDir d;
  const std::string shard = d / "s.tar";
  const json want = json::parse(test::run_python(webdataset_shard_script(shard, "GNU_FORMAT")));
  const std::string sha = test::run_python("import hashlib; print(hashlib.sha256(open('" + shard +
                                           "', 'rb').read()).hexdigest(), end='')");
  ASSERT_EQ(sha.size(), 64u) << sha;
  open_tar_shards({shard});
  TarShardIndex index;
  uint64_t size = 0;
  int64_t mtime = 0;
  std::string recorded;
  ASSERT_TRUE(decode_tar_sidecar(test::read_text(shard + ".idx"), &index, &size, &mtime, &recorded));
  EXPECT_EQ(recorded, sha);
  EXPECT_EQ(size, fs::file_size(shard));

  test::write_text(shard + ".idx", encode_tar_sidecar(index, size, mtime, ""));  // the old format
  ASSERT_EQ(test::read_text(shard + ".idx").substr(0, 8), "CRTARIX1");
  ASSERT_TRUE(decode_tar_sidecar(test::read_text(shard + ".idx"), &index, &size, &mtime, &recorded));
  EXPECT_EQ(recorded, "");
  auto old = open_tar_shards({shard});
  EXPECT_NE(old->describe().find("1 read from .idx, 0 built, 1 given the shard's SHA-256"), std::string::npos)
      << old->describe();
  expect_samples(*old, shard, want);
  ASSERT_TRUE(decode_tar_sidecar(test::read_text(shard + ".idx"), &index, &size, &mtime, &recorded));
  EXPECT_EQ(recorded, sha);
  const std::string again = open_tar_shards({shard})->describe();
  EXPECT_NE(again.find("1 read from .idx, 0 built"), std::string::npos) << again;
  EXPECT_EQ(again.find("given"), std::string::npos) << again;
}

TEST(TarShardSource, TruncatedOrCorruptShardNamesTheOffset) {
  test::TempDir d;
  const std::string shard = d / "s.tar";
  test::run_python(webdataset_shard_script(shard, "GNU_FORMAT"));
  const std::string raw = test::read_text(shard);
  // Headers: 0 data.v1 (dir), 512 s001.jpg (1000 bytes → next header at 2048).
  test::write_text(d / "cut1.tar", raw.substr(0, 2048 + 100));
  test::expect_bad_input([&] { open_tar_shards({d / "cut1.tar"}); }, {"cut1.tar", "byte 2048", "truncated"});
  test::write_text(d / "cut2.tar", raw.substr(0, 512 + 512 + 300));
  test::expect_bad_input([&] { open_tar_shards({d / "cut2.tar"}); }, {"cut2.tar", "byte 512", "truncated"});
  test::write_text(d / "cut3.tar", raw.substr(0, 2048));
  test::expect_bad_input([&] { open_tar_shards({d / "cut3.tar"}); }, {"cut3.tar", "byte 2048", "truncated"});
  std::string bad = raw;
  bad[512 + 3] = static_cast<char>(bad[512 + 3] ^ 1);
  test::write_text(d / "bad.tar", bad);
  test::expect_bad_input([&] { open_tar_shards({d / "bad.tar"}); }, {"bad.tar", "checksum", "byte 512"});
  bad = raw;
  bad.replace(512 + 124, 11, "0000000x000");  // size field
  test::write_text(d / "size.tar", bad);
  test::expect_bad_input([&] { open_tar_shards({d / "size.tar"}); }, {"size.tar", "byte 512"});
  test::write_text(d / "label.tar", "");
  test::run_python(kPyImages + kPyTar + "with tarfile.open('" + d / "label.tar" +
                   "', 'w') as t:\n    add(t, 'a.jpg', b'x'); add(t, 'a.cls', b'seven')\n");
  test::expect_bad_input([&] { open_tar_shards({d / "label.tar"}); }, {"label.tar", "a.cls", "seven"});
  test::expect_bad_input([&] { open_tar_shards({d / "nope.tar"}); }, {"nope.tar"});
}

// Fuzz-style (formats-and-reliability E): a shard cut anywhere is bad input or, when the cut
// falls in the trailing zero blocks, the whole archive; never a crash or a wrong sample.
TEST(TarShardSource, EveryTruncationIsBadInputOrTheWholeArchive) {
  test::TempDir d;
  const std::string shard = d / "s.tar";
  const json want = json::parse(test::run_python(webdataset_shard_script(shard, "PAX_FORMAT")));
  const std::string raw = test::read_text(shard);
  for (size_t cut = 0; cut < raw.size(); cut += cut < 6000 ? 23 : 509) {
    test::write_text(d / "cut.tar", raw.substr(0, cut));
    try {
      auto src = open_tar_shards({d / "cut.tar"});
      expect_samples(*src, d / "cut.tar", want);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
      EXPECT_NE(std::string(e.what()).find("cut.tar"), std::string::npos) << e.what();
    }
  }
}

TEST(TarShardSource, BracePatternOverThreeShards) {
  test::TempDir d;
  json want = json::array();
  for (int s = 0; s < 3; ++s) {
    const std::string shard = d / ("part-00000" + std::to_string(s) + ".tar");
    const json w = json::parse(test::run_python(kPyImages + kPyTar + "want = []\nwith tarfile.open('" + shard +
                                                "', 'w') as t:\n    for i in range(2):\n"
                                                "        k = 's%d_%d' % (" + std::to_string(s) + ", i)\n"
                                                "        add(t, k + '.jpg', blob(k, 300 + i)); add(t, k + '.cls', b'%d' % i)\n"
                                                "        want.append([k, blob(k, 300 + i).hex(), i])\n"
                                                "print(json.dumps(want))\n"));
    for (auto& e : w) want.push_back({shard, e[1], e[2], e[0]});
  }
  auto src = open_samples(d / "part-{000000..000002}.tar");
  ASSERT_EQ(src->size(), 6);
  for (int64_t i = 0; i < 6; ++i) {
    const EncodedSample s = src->get(i);
    EXPECT_EQ(s.name, want[i][0].get<std::string>() + ":" + want[i][3].get<std::string>());
    EXPECT_EQ(bytes_of(s), unhex(want[i][1].get<std::string>()));
    EXPECT_EQ(s.label, want[i][2].get<int64_t>());
  }
  EXPECT_EQ(src->classes(), (std::vector<std::string>{"0", "1"}));
  // A comma-separated list means the same shards.
  auto listed = open_samples(d / "part-000000.tar," + d / "part-00000{1,2}.tar");
  EXPECT_EQ(listed->size(), 6);
  test::expect_bad_input([&] { open_samples(d / "part-{000000..000003}.tar"); }, {"part-000003.tar"});
}

// ---- LMDB -----------------------------------------------------------------------------------

TEST(LmdbSource, WriteFromImageFolderReadBackEqual) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  write_lmdb(*folder, d / "db");
  EXPECT_TRUE(fs::exists(d / "db/data.mdb"));
  for (const auto& e : fs::directory_iterator(d / "db")) {
    EXPECT_FALSE(is_atomic_temp_name(e.path().filename().string())) << e.path();
  }
  for (const std::string& path : {d / "db", d / "db/data.mdb"}) {  // folder, or the file itself
    auto db = open_lmdb(path);
    EXPECT_EQ(db->classes(), folder->classes());
    ASSERT_EQ(db->size(), folder->size());
    for (int64_t i = 0; i < db->size(); ++i) {
      const EncodedSample a = folder->get(i), b = db->get(i);
      EXPECT_EQ(bytes_of(a), bytes_of(b)) << i;
      EXPECT_EQ(a.label, b.label) << i;
    }
    EXPECT_EQ(db->files_held(), 1);  // D6: data.mdb stays open (no lock file)
    EXPECT_EQ(db->files_per_read(), 0);
    expect_declared_descriptors([&] { return open_lmdb(path); }, 4);
  }
}

TEST(LmdbSource, ConcurrentGetsReturnCorrectBytes) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  write_lmdb(*folder, d / "db");
  auto db = open_lmdb(d / "db");
  std::vector<std::string> want;
  for (int64_t i = 0; i < folder->size(); ++i) want.push_back(bytes_of(folder->get(i)));
  std::atomic<int> wrong{0};
  std::vector<EncodedSample> kept(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 2000; ++k) {
        const int64_t i = (k * 7 + t) % db->size();
        EncodedSample s = db->get(i);
        if (bytes_of(s) != want[static_cast<size_t>(i)]) ++wrong;
        if (k == 1000) kept[static_cast<size_t>(t)] = std::move(s);  // outlives its thread
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(bytes_of(kept[static_cast<size_t>(t)]), want[static_cast<size_t>((1000 * 7 + t) % db->size())]);
  }
  db.reset();  // samples keep the environment alive
  EXPECT_EQ(bytes_of(kept[0]), want[static_cast<size_t>(7000 % folder->size())]);
}

TEST(LmdbSource, NotAnLmdbIsBadInput) {
  test::TempDir d;
  fs::create_directories(d / "x");
  test::write_text(d / "x/data.mdb", std::string(10000, 'z'));
  test::expect_bad_input([&] { open_lmdb(d / "x"); }, {"x", "LMDB"});
  test::expect_bad_input([&] { open_lmdb(d / "none"); }, {"none", "does not exist"});
}

// ---- packed ---------------------------------------------------------------------------------

struct IndexFile {
  json header;
  std::vector<std::array<uint64_t, 4>> records;  // shard, size, offset, label
};

IndexFile read_index(const std::string& path) {
  const std::string raw = test::read_text(path);
  IndexFile f;
  const uint64_t n = le(raw, 8, 8);
  f.header = json::parse(raw.substr(16, n));
  for (size_t at = 16 + n; at + 24 <= raw.size(); at += 24) {
    f.records.push_back({le(raw, at, 4), le(raw, at + 4, 4), le(raw, at + 8, 8), le(raw, at + 16, 8)});
  }
  return f;
}

void expect_same(const SampleSource& a, const SampleSource& b) {
  EXPECT_EQ(a.classes(), b.classes());
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) {
    const EncodedSample x = a.get(i), y = b.get(i);
    EXPECT_EQ(bytes_of(x), bytes_of(y)) << i;
    EXPECT_EQ(x.label, y.label) << i;
  }
}

TEST(PackSamples, OriginalRoundTripAlignedAcrossShards) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  for (int64_t align : {int64_t{4096}, int64_t{64}}) {
    PackOptions o;
    o.align = align;
    o.shard_bytes = 12000;  // several samples per shard, several shards
    const std::string dst = d / ("p" + std::to_string(align));
    const PackReport r = pack_samples(*folder, dst, o);
    EXPECT_EQ(r.samples, folder->size());
    EXPECT_TRUE(r.bad.empty());
    auto packed = open_packed(dst + "/index.crpk");
    expect_same(*folder, *packed);
    EXPECT_EQ(packed->files_held(), 0);  // D6: shards are mapped, their descriptors closed
    EXPECT_EQ(packed->files_per_read(), 0);
    expect_declared_descriptors([&] { return open_packed(dst); }, 7);
    EXPECT_NE(packed->get(2).name.find(dst + "/shard-00000.bin#2"), std::string::npos) << packed->get(2).name;

    const IndexFile idx = read_index(dst + "/index.crpk");
    EXPECT_EQ(idx.header["align"], align);
    EXPECT_EQ(idx.header["mode"], "original");
    EXPECT_GE(idx.header["shards"].size(), 2u);
    int64_t bytes = 0;
    for (const auto& rec : idx.records) {
      EXPECT_EQ(rec[2] % static_cast<uint64_t>(align), 0u) << "offset " << rec[2];  // D11: page-aligned
      const std::string shard = dst + "/" + idx.header["shards"][rec[0]].get<std::string>();
      EXPECT_LE(rec[2] + rec[1], fs::file_size(shard));
      bytes += static_cast<int64_t>(rec[1]);
    }
    EXPECT_EQ(bytes, r.bytes);
    EXPECT_EQ(r.files.size(), idx.header["shards"].size() + 1);
    for (const auto& e : fs::directory_iterator(dst)) {
      EXPECT_FALSE(is_atomic_temp_name(e.path().filename().string())) << e.path();
    }
  }
}

TEST(PackSamples, FourThreadsWriteTheSameBytesAsOne) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  PackOptions o;
  o.shard_bytes = 20000;
  pack_samples(*folder, d / "one", o);
  o.threads = 4;
  pack_samples(*folder, d / "four", o);
  for (const char* f : {"index.crpk", "shard-00000.bin", "shard-00001.bin"}) {
    EXPECT_EQ(test::read_text(d / "one/" + f), test::read_text(d / "four/" + f)) << f;
  }
}

// A source whose sample `fail_at` cannot be read (an I/O error).
class FailingSource final : public SampleSource {
 public:
  FailingSource(const SampleSource& inner, int64_t fail_at) : inner_(inner), fail_at_(fail_at) {}
  int64_t size() const override { return inner_.size(); }
  EncodedSample get(int64_t i) const override {
    if (i == fail_at_) throw runtime_error("sample {}: disk on fire", i);
    return inner_.get(i);
  }
  const std::vector<std::string>& classes() const override { return inner_.classes(); }
  std::string describe() const override { return "failing"; }

 private:
  const SampleSource& inner_;
  int64_t fail_at_;
};

TEST(PackSamples, FailedPackLeavesNoIndexBehind) {  // law 5
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  PackOptions o;
  o.shard_bytes = 8000;
  pack_samples(*folder, d / "p", o);
  ASSERT_TRUE(fs::exists(d / "p/index.crpk"));
  FailingSource failing(*folder, 9);
  for (int threads : {1, 3}) {
    o.threads = threads;
    EXPECT_THROW(pack_samples(failing, d / "p", o), Error);
    EXPECT_FALSE(fs::exists(d / "p/index.crpk"));  // the old one is gone too
    for (const auto& e : fs::directory_iterator(d / "p")) {
      EXPECT_FALSE(is_atomic_temp_name(e.path().filename().string())) << e.path();
    }
  }
  test::expect_bad_input([&] { open_samples(d / "p"); }, {"p"});
}

TEST(PackedSource, CorruptIndexIsBadInput) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  PackOptions o;
  o.align = 64;
  pack_samples(*folder, d / "p", o);
  const std::string good = test::read_text(d / "p/index.crpk");
  const std::string path = d / "p/index.crpk";
  const uint64_t json_len = le(good, 8, 8);
  auto expect_bad = [&](std::string bytes, std::initializer_list<const char*> needles) {
    test::write_text(path, bytes);
    test::expect_bad_input([&] { open_packed(path); }, needles);
  };
  std::string bad = good;
  bad[3] = 'X';
  expect_bad(bad, {"index.crpk", "CRPKIDX1"});
  expect_bad(good.substr(0, good.size() - 24), {"index.crpk", "10 samples", "216 bytes follow"});
  expect_bad(good + std::string(5, '\0'), {"index.crpk", "follow the JSON header"});
  expect_bad(good.substr(0, 12), {"index.crpk"});
  bad = good;
  bad[8] = static_cast<char>(0xff);  // JSON length past the end
  bad[12] = static_cast<char>(0x7f);
  expect_bad(bad, {"index.crpk", "JSON header claims"});
  bad = good;
  bad[16 + 1] = '#';
  expect_bad(bad, {"index.crpk", "JSON"});
  // Sample 4's offset past the shard's end.
  bad = good;
  const size_t rec = 16 + json_len + 4 * 24;
  for (int i = 0; i < 8; ++i) bad[rec + 8 + i] = static_cast<char>(i == 2 ? 0x10 : 0);  // 1 MiB
  expect_bad(bad, {"index.crpk", "sample 4", "shard-00000.bin", "holds"});
  bad = good;
  bad[rec] = 9;  // shard 9 of 1
  expect_bad(bad, {"index.crpk", "sample 4", "shard 9"});
  // A missing shard.
  test::write_text(path, good);
  EXPECT_EQ(open_packed(d / "p")->size(), 10);  // a folder means <folder>/index.crpk
  fs::rename(d / "p/shard-00000.bin", d / "p/gone");
  test::expect_bad_input([&] { open_packed(path); }, {"shard-00000.bin", "missing"});
}

TEST(PackedSource, EveryTruncationOfTheIndexIsBadInput) {
  test::TempDir d;
  make_byte_folder(d / "f");
  pack_samples(*open_image_folder(d / "f"), d / "p", PackOptions{});
  const std::string good = test::read_text(d / "p/index.crpk");
  for (size_t cut = 0; cut < good.size(); ++cut) {
    test::write_text(d / "p/index.crpk", good.substr(0, cut));
    test::expect_bad_input([&] { open_packed(d / "p"); }, {"index.crpk"});
  }
}

// Pack modes that decode: a folder of real PNG/JPEG images made by PIL.
std::string make_image_folder(const std::string& root) {
  return test::run_python(kPyImages + "root = '" + root + "'\n" + R"(
out = []
for c in ['a', 'b']:
    for i in range(3):
        w, h = [(32, 24), (24, 40), (64, 48)][i]
        a = pixels(w, h, ord(c) * 10 + i)
        write(f'{root}/{c}/{i}.png', encode(a, 'PNG'))
        write(f'{root}/{c}/{i}j.jpg', encode(a, 'JPEG'))
        out.append([f'{root}/{c}/{i}.png', w, h, a.tobytes().hex()])
print(json.dumps(out))
)");
}

TEST(PackSamples, ValidateListsCorruptJpegAndTruncatedPngAndLeavesThemOut) {  // D5
  test::TempDir d;
  make_image_folder(d / "f");
  test::run_python(kPyImages + "root = '" + d / "f" + "'\n" + R"(
j = open(f'{root}/a/1j.jpg', 'rb').read()
sof = j.find(b'\xff\xc0')                    # a real JPEG whose frame header says 0x0 pixels
write(f'{root}/a/bad.jpg', j[:sof + 5] + bytes(4) + j[sof + 9:])
p = open(f'{root}/b/2.png', 'rb').read()
write(f'{root}/b/cut.png', p[:len(p) // 2])
)");
  auto folder = open_image_folder(d / "f");
  PackOptions o;
  o.validate = true;
  o.threads = 3;
  const PackReport r = pack_samples(*folder, d / "p", o);
  ASSERT_EQ(r.bad.size(), 2u);
  EXPECT_EQ(r.bad[0].rfind(d / "f/a/bad.jpg: ", 0), 0u) << r.bad[0];
  EXPECT_EQ(r.bad[1].rfind(d / "f/b/cut.png: ", 0), 0u) << r.bad[1];
  for (const auto& b : r.bad) EXPECT_GT(b.size(), b.find(": ") + 5) << "a reason follows the name: " << b;
  EXPECT_EQ(r.samples, folder->size() - 2);
  auto packed = open_packed(d / "p");
  ASSERT_EQ(packed->size(), folder->size() - 2);
  int64_t j = 0;
  for (int64_t i = 0; i < folder->size(); ++i) {
    const EncodedSample s = folder->get(i);
    if (s.name.find("bad.jpg") != std::string::npos || s.name.find("cut.png") != std::string::npos) continue;
    EXPECT_EQ(bytes_of(packed->get(j)), bytes_of(s)) << s.name;
    ++j;
  }
  // Without validate nothing is decoded: the bad samples are copied as they are.
  o.validate = false;
  EXPECT_EQ(pack_samples(*folder, d / "q", o).samples, folder->size());
}

TEST(PackSamples, ReencodeKeepsSidesWithinMaxSide) {
  test::TempDir d;
  make_image_folder(d / "f");
  auto folder = open_image_folder(d / "f");
  PackOptions o;
  o.mode = PackOptions::Mode::kReencode;
  o.max_side = 20;
  o.quality = 80;
  o.threads = 2;
  const PackReport r = pack_samples(*folder, d / "p", o);
  EXPECT_TRUE(r.bad.empty());
  auto packed = open_packed(d / "p");
  ASSERT_EQ(packed->size(), folder->size());
  for (int64_t i = 0; i < packed->size(); ++i) {
    const EncodedSample s = packed->get(i);
    const ImageInfo info = probe_image(s.data, s.size, s.name);
    EXPECT_EQ(info.encoding, Encoding::kJpeg);
    EXPECT_EQ(std::max(info.width, info.height), 20) << s.name;
    EXPECT_EQ(s.label, folder->get(i).label);
  }
  EXPECT_EQ(read_index(d / "p/index.crpk").header["mode"], "reencode");
  o.threads = 1;  // the same bytes whatever the thread count
  pack_samples(*folder, d / "p1", o);
  EXPECT_EQ(test::read_text(d / "p1/shard-00000.bin"), test::read_text(d / "p/shard-00000.bin"));
  EXPECT_EQ(test::read_text(d / "p1/index.crpk"), test::read_text(d / "p/index.crpk"));
}

TEST(PackSamples, RawRoundTripsPixels) {
  test::TempDir d;
  const json want = json::parse(make_image_folder(d / "f"));
  // Only the PNGs: lossless, so the stored pixels equal PIL's.
  test::TempDir pngs;
  for (const auto& e : want) {
    const std::string src = e[0].get<std::string>();
    const std::string rel = src.substr((d / "f").size() + 1);
    fs::create_directories(fs::path(pngs / rel).parent_path());
    fs::copy_file(src, pngs / rel);
  }
  auto folder = open_image_folder(pngs.path());
  ASSERT_EQ(folder->size(), static_cast<int64_t>(want.size()));
  PackOptions o;
  o.mode = PackOptions::Mode::kRaw;
  pack_samples(*folder, d / "p", o);
  auto packed = open_packed(d / "p");
  ASSERT_EQ(packed->size(), folder->size());
  for (int64_t i = 0; i < packed->size(); ++i) {
    const EncodedSample s = packed->get(i);
    ASSERT_GE(s.size, kRawHeaderBytes);
    const std::string b = bytes_of(s);
    EXPECT_EQ(b.substr(0, 4), "CRWP");
    EXPECT_EQ(le(b, 4, 4), want[i][2].get<uint64_t>());  // height
    EXPECT_EQ(le(b, 8, 4), want[i][1].get<uint64_t>());  // width
    EXPECT_EQ(le(b, 12, 4), 3u);
    EXPECT_EQ(b.substr(kRawHeaderBytes), unhex(want[i][3].get<std::string>())) << s.name;
    EXPECT_EQ(detect_encoding(s.data, s.size), Encoding::kRaw);
  }
  // Downsized by exactly 2 (64×48 → 32×24): area resize = the mean of each 2×2 block.
  o.max_side = 32;
  pack_samples(*folder, d / "half", o);
  auto half = open_packed(d / "half");
  for (int64_t i = 0; i < half->size(); ++i) {
    if (want[i][1] != 64) continue;
    const std::string b = bytes_of(half->get(i));
    ASSERT_EQ(le(b, 4, 4), 24u);
    ASSERT_EQ(le(b, 8, 4), 32u);
    const std::string full = unhex(want[i][3].get<std::string>());
    int worst = 0;
    for (int y = 0; y < 24; ++y) {
      for (int x = 0; x < 32; ++x) {
        for (int c = 0; c < 3; ++c) {
          int sum = 0;
          for (int dy = 0; dy < 2; ++dy) {
            for (int dx = 0; dx < 2; ++dx) sum += static_cast<uint8_t>(full[((2 * y + dy) * 64 + 2 * x + dx) * 3 + c]);
          }
          const int got = static_cast<uint8_t>(b[kRawHeaderBytes + (y * 32 + x) * 3 + c]);
          worst = std::max(worst, std::abs(got * 4 - sum));
        }
      }
    }
    EXPECT_LE(worst, 2) << "pixel differs from the 2x2 mean by more than rounding";
  }
}

// ---- evenly spaced subset -------------------------------------------------------------------

// An image folder of raw-pixel samples ("CRWP", see decode.h), `per_class[c]` in class c: sample
// k (in folder order) is a 4×4 RGB image whose every byte is k, so a pixel names its sample.
void make_raw_folder(const std::string& root, const std::vector<int>& per_class) {
  int k = 0;
  for (size_t c = 0; c < per_class.size(); ++c) {
    const std::string dir = root + "/class" + std::to_string(c);
    fs::create_directories(dir);
    for (int i = 0; i < per_class[c]; ++i, ++k) {
      std::string raw = std::string(kRawMagic, 4) + std::string("\x04\0\0\0\x04\0\0\0\x03\0\0\0", 12);
      raw += std::string(4 * 4 * 3, static_cast<char>(k));
      char name[16];
      std::snprintf(name, sizeof(name), "%04d.png", i);  // sorted order = creation order
      test::write_text(dir + "/" + name, raw);
    }
  }
}

TEST(EvenSubsetSource, KeepsEveryClassInProportionAndMapsIndexIToISizeOverN) {
  test::TempDir d;
  make_raw_folder(d / "f", {30, 60, 90});
  std::shared_ptr<const SampleSource> folder = open_image_folder(d / "f");
  ASSERT_EQ(folder->size(), 180);
  for (int64_t n : {60, 7, 1, 179, 180}) {
    auto sub = subset_evenly(folder, n);
    ASSERT_EQ(sub->size(), n);
    EXPECT_EQ(sub->classes(), folder->classes());
    std::vector<int64_t> per_class(3, 0);
    for (int64_t i = 0; i < n; ++i) {
      const EncodedSample s = sub->get(i), b = folder->get(i * 180 / n);
      EXPECT_EQ(s.name, b.name) << "n=" << n << " i=" << i;
      EXPECT_EQ(s.label, b.label) << s.name;
      EXPECT_EQ(bytes_of(s), bytes_of(b)) << s.name;
      ++per_class[static_cast<size_t>(s.label)];
    }
    const double share[3] = {30.0 / 180, 60.0 / 180, 90.0 / 180};
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_LT(std::abs(static_cast<double>(per_class[c]) - share[c] * static_cast<double>(n)), 1.0)
          << "class " << c << " holds " << per_class[c] << " of " << n;
    }
    if (n == 60) {
      EXPECT_EQ(per_class, (std::vector<int64_t>{10, 20, 30}));
    }
    if (n >= 3) {
      EXPECT_GT(*std::min_element(per_class.begin(), per_class.end()), 0) << "n=" << n;
    }
  }
  auto sub = subset_evenly(folder, 60);
  EXPECT_EQ(sub->describe(), "60 evenly spaced samples of " + folder->describe());
  EXPECT_EQ(sub->files_per_read(), 1);  // forwarded: the loader's D6 check sees the real source
  EXPECT_EQ(sub->files_held(), 0);
  test::expect_bad_input([&] { subset_evenly(folder, 181); }, {"181", "180", "image folder"});
  test::expect_bad_input([&] { subset_evenly(folder, 0); }, {"0 evenly spaced", "180"});
  write_lmdb(*folder, d / "db");
  auto lmdb_sub = subset_evenly(open_lmdb(d / "db"), 9);
  EXPECT_EQ(lmdb_sub->files_held(), 1);
  EXPECT_EQ(lmdb_sub->files_per_read(), 0);
  EXPECT_EQ(lmdb_sub->classes(), folder->classes());
  EXPECT_EQ(bytes_of(lmdb_sub->get(8)), bytes_of(folder->get(8 * 180 / 9)));
}

// data.train_samples / data.test_samples through data::make_data: N evenly spaced samples of an
// image source, the first N of IDX files, and more than there are refused naming the key.
TEST(EvenSubsetSource, MakeDataHonoursTrainAndTestSamplesForImages) {
  test::TempDir d;
  make_raw_folder(d / "train", {30, 60, 90});
  make_raw_folder(d / "test", {10, 10, 10});
  data::DataConfig job;
  job.dataset = data::DataConfig::Dataset::kImages;
  job.train_path = d / "train";
  job.test_path = d / "test";
  job.crop = 4;
  job.train_samples = 60;
  job.test_samples = 6;
  const data::DataSetup ds = data::make_data(job, 1);
  ASSERT_EQ(ds.train->size(), 60);
  ASSERT_EQ(ds.test->size(), 6);
  EXPECT_EQ(ds.num_classes, 3);
  test::expect_contains(ds.train->describe(), "60 evenly spaced samples of image folder " + d / "train");
  std::vector<uint8_t> px(static_cast<size_t>(ds.train->output_spec().bytes()));
  for (const auto& [pipeline, size] : {std::pair{ds.train, int64_t{180}}, std::pair{ds.test, int64_t{30}}}) {
    std::vector<int64_t> per_class(3, 0);
    for (int64_t i = 0; i < pipeline->size(); ++i) {
      const int64_t label = pipeline->produce(i, 0, px.data());
      const int64_t k = i * size / pipeline->size();  // the folder sample it must be
      EXPECT_EQ(px[0], static_cast<uint8_t>(k)) << pipeline->describe() << " sample " << i;
      EXPECT_EQ(px.back(), static_cast<uint8_t>(k)) << pipeline->describe() << " sample " << i;
      ++per_class[static_cast<size_t>(label)];
    }
    const int64_t third = pipeline->size() == 60 ? 10 : 2;  // train: 1:2:3 like the folder; test: even
    EXPECT_EQ(per_class, (std::vector<int64_t>{third, pipeline->size() == 60 ? 2 * third : third,
                                               pipeline->size() == 60 ? 3 * third : third}))
        << pipeline->describe();
  }
  // The bench loader's pipeline over a path takes data.train_samples the same way (and
  // data.test_samples for the evaluation split, --eval).
  auto bench = data::make_pipeline_for_path(d / "train", job, 1, true);
  ASSERT_EQ(bench->size(), 60);
  bench->produce(59, 0, px.data());
  EXPECT_EQ(px[0], 59 * 180 / 60);
  test::expect_bad_input([&] { data::make_pipeline_for_path(d / "test", job, 1, true); },
                         {"data.train_samples = 60", "30 samples", "test"});
  EXPECT_EQ(data::make_pipeline_for_path(d / "test", job, 1, false)->size(), 6);
  // More than the data holds is a wrong config, for images and IDX alike.
  job.train_samples = 181;
  test::expect_bad_input([&] { data::make_data(job, 1); }, {"data.train_samples = 181", "holds 180 samples"});
  job.train_samples = 0;
  job.test_samples = 31;
  test::expect_bad_input([&] { data::make_data(job, 1); }, {"data.test_samples = 31", "holds 30 samples"});
  job.test_samples = 0;
  EXPECT_EQ(data::make_data(job, 1).train->size(), 180);  // 0 = all

  std::vector<uint8_t> idx_px(6 * 4);
  for (size_t i = 0; i < idx_px.size(); ++i) idx_px[i] = static_cast<uint8_t>(i / 4);
  io::write_idx(d / "img", io::IdxArray{io::DType::kU8, {6, 2, 2}, idx_px}, false);
  io::write_idx(d / "lab", io::IdxArray{io::DType::kU8, {6}, {5, 4, 3, 2, 1, 0}}, false);
  job.dataset = data::DataConfig::Dataset::kIdx;
  job.train_images = job.test_images = d / "img";
  job.train_labels = job.test_labels = d / "lab";
  job.pieces.of<data::RandomHorizontalFlipOptions>("hflip").p = 0;
  job.train_samples = 3;
  const data::DataSetup idx = data::make_data(job, 1);
  ASSERT_EQ(idx.train->size(), 3);  // IDX: the first N
  EXPECT_EQ(idx.test->size(), 6);
  std::vector<uint8_t> one(4);
  EXPECT_EQ(idx.train->produce(2, 0, one.data()), 3);
  EXPECT_EQ(one[0], 2);
  job.train_samples = 7;
  test::expect_bad_input([&] { data::make_data(job, 1); }, {"data.train_samples = 7", "holds 6 samples"});
  job.train_samples = 0;
  job.test_samples = 7;
  test::expect_bad_input([&] { data::make_data(job, 1); }, {"data.test_samples = 7", "holds 6 samples"});
}

// ---- detection ------------------------------------------------------------------------------

TEST(OpenSamplesSource, DetectsEveryKind) {
  test::TempDir d;
  make_byte_folder(d / "f");
  auto folder = open_samples(d / "f");
  EXPECT_NE(folder->describe().find("image folder"), std::string::npos);
  pack_samples(*folder, d / "p", PackOptions{});
  EXPECT_NE(open_samples(d / "p")->describe().find("packed"), std::string::npos);
  EXPECT_NE(open_samples(d / "p/index.crpk")->describe().find("packed"), std::string::npos);
  fs::copy_file(d / "p/index.crpk", d / "p/renamed.idx");
  EXPECT_NE(open_samples(d / "p/renamed.idx")->describe().find("packed"), std::string::npos);  // by magic
  write_lmdb(*folder, d / "db");
  EXPECT_NE(open_samples(d / "db")->describe().find("LMDB"), std::string::npos);
  test::run_python(kPyImages + kPyTar + "with tarfile.open('" + d / "one.tar" +
                   "', 'w') as t:\n    add(t, 'a.jpg', b'xyz'); add(t, 'a.cls', b'0')\n");
  EXPECT_NE(open_samples(d / "one.tar")->describe().find("tar shard"), std::string::npos);
  fs::copy_file(d / "one.tar", d / "one.shard");
  EXPECT_EQ(open_samples(d / "one.shard")->size(), 1);  // by the ustar magic
  EXPECT_EQ(open_samples(d / "one.tar," + d / "one.shard")->size(), 2);

  fs::create_directories(d / "empty");
  test::expect_bad_input([&] { open_samples(d / "empty"); }, {"empty", "is empty", "accepted"});
  test::write_text(d / "random.bin", std::string(1000, '\x17'));
  test::expect_bad_input([&] { open_samples(d / "random.bin"); }, {"random.bin", "accepted", "image folder"});
  fs::create_directories(d / "flat");
  test::write_text(d / "flat/a.txt", "x");
  test::expect_bad_input([&] { open_samples(d / "flat"); }, {"flat", "1 files", "accepted"});
  test::expect_bad_input([&] { open_samples(d / "nothing"); }, {"nothing", "does not exist"});
}

}  // namespace
}  // namespace crucible::data
