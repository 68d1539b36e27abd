// Atomic files (law 5): a committed write replaces the target whole; an abandoned one leaves
// the old file and no temporary behind; the host allocator tuning applies on glibc.
#include "crucible/core/file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "crucible/core/error.h"
#include "crucible/core/memory.h"
#include "crucible/core/sha256.h"
#include "test_util.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

size_t count_files(const std::string& dir) {
  size_t n = 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

TEST(AtomicFile, CommitReplacesTarget) {
  test::TempDir d;
  write_file_atomic(d / "a.txt", "old");
  write_file_atomic(d / "a.txt", "new contents");
  EXPECT_EQ(read_file(d / "a.txt"), "new contents");
  EXPECT_EQ(count_files(d.path()), 1u);
}

TEST(AtomicFile, AbandonedWriteLeavesOldFileAndNoTemp) {
  test::TempDir d;
  write_file_atomic(d / "a.txt", "old");
  {
    AtomicFile f(d / "a.txt");
    f.write("half of a new");
    EXPECT_EQ(count_files(d.path()), 2u);  // the temporary exists while writing
  }
  EXPECT_EQ(read_file(d / "a.txt"), "old");
  EXPECT_EQ(count_files(d.path()), 1u);
}

TEST(AtomicFile, TempNamesAreRecognised) {
  EXPECT_TRUE(is_atomic_temp_name("ckpt-000000010.safetensors.tmp-1234"));
  EXPECT_FALSE(is_atomic_temp_name("ckpt-000000010.safetensors"));
}

TEST(ReadFile, MissingFileIsBadInputNamingThePath) {
  try {
    read_file("/nonexistent/crucible/file");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/crucible/file"), std::string::npos);
  }
}

// read(2) until the end, whatever fstat said: empty, one byte, and sizes around the buffer's
// first capacity; both readers give the file's bytes; a folder is refused by name.
TEST(ReadFile, WholeFilesOfAnySizeAndFoldersRefused) {
  test::TempDir d;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{70001}}) {
    std::string content(n, '\0');
    for (size_t i = 0; i < n; ++i) content[i] = static_cast<char>(i * 131 + 7);
    const std::string path = d / ("f" + std::to_string(n));
    test::write_text(path, content);
    EXPECT_EQ(read_file(path), content) << n;
    const FileBytes b = read_file_bytes(path);
    ASSERT_EQ(b.size, n);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data.get()), b.size), content) << n;
  }
  for (bool bytes : {false, true}) {
    try {
      if (bytes) {
        read_file_bytes(d.path());
      } else {
        read_file(d.path());
      }
      FAIL() << "a folder was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
}

TEST(Sha256, KnownVector) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CRUCIBLE_SANITIZED 1
#endif
#endif

TEST(Memory, HostAllocatorTuningAppliesOnGlibc) {
#if defined(CRUCIBLE_SANITIZED)
  GTEST_SKIP() << "the sanitizer runtime replaces malloc";
#elif defined(__GLIBC__)
  EXPECT_TRUE(tune_host_allocator());
#else
  GTEST_SKIP() << "not glibc";
#endif
}

// T13 on the CPU: with the training allocator settings glibc keeps what tensors free (for the next
// step's speed); the epoch-end release gives it back. Half of 96 touched 1 MiB blocks freed in a
// checkerboard (the heap cannot shrink from its top) stay resident until the release, which
// returns at least 80% of them.
TEST(Memory, TheReleaseGivesFreedHeapMemoryBackT13) {
#if defined(CRUCIBLE_SANITIZED)
  GTEST_SKIP() << "the sanitizer runtime replaces malloc";
#elif !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc";
#else
  ASSERT_TRUE(tune_host_allocator());
  ASSERT_GT(resident_memory_bytes(), 0u);
  constexpr size_t kBlock = 1 << 20;
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 96; ++i) {
    blocks.emplace_back(new char[kBlock]);
    std::memset(blocks.back().get(), i + 1, kBlock);  // resident
  }
  for (size_t i = 0; i < blocks.size(); i += 2) blocks[i].reset();  // 48 MiB of holes
  const uint64_t held = resident_memory_bytes();
  const int64_t released = release_freed_host_memory();
  const uint64_t after = resident_memory_bytes();
  std::printf("held %s, released %s, after %s\n", human_bytes(held).c_str(),
              human_bytes(static_cast<uint64_t>(released)).c_str(), human_bytes(after).c_str());
  EXPECT_GE(released, static_cast<int64_t>(48 * kBlock * 8 / 10));
  EXPECT_LE(after + static_cast<uint64_t>(released) * 9 / 10, held);
  for (size_t i = 1; i < blocks.size(); i += 2) EXPECT_EQ(blocks[i][kBlock / 2], static_cast<char>(i + 1));
  // Nothing more to give back right after.
  EXPECT_LT(release_freed_host_memory(), static_cast<int64_t>(4 * kBlock));
#endif
}

}  // namespace
}  // namespace crucible
