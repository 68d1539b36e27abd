// Format detection from content, not extension (D12), conversions between every writable
// format that come back bit-exact, and archives that inflate (issue 10): inspect reads headers
// only, reads and converts stay under the memory budget, convert streams npz members. Inputs
// that inflate to GiBs are built in a few KiB of work (zeros_npz, zeros_gzip); time and peak
// memory are measured in a forked child (in_child). To add a case: a TEST() here.
#include "crucible/io/tensor_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "crucible/core/memory.h"
#include "crucible/core/mmap.h"
#include "crucible/io/idx.h"
#include "crucible/io/npy.h"
#include "crucible/io/npz.h"
#include "crucible/io/safetensors.h"
#include "test_util.h"
#include "zeros_archive.h"

namespace crucible::io {
namespace {

using test::expect_bad_input;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = uint64_t{1} << 20;

using test::deflate_zeros;
using test::header_for;
using test::put;
using test::write_zip;
using test::ZipEntry;
using test::zeros_gzip_idx;
using test::zeros_npz;

// --- measuring a call in a child process ----------------------------------------------------

struct ChildRun {
  double seconds = 0;
  uint64_t start_rss = 0;  // bytes: the child's resident size (VmRSS) when `f` started
  uint64_t peak_rss = 0;   // bytes: its peak resident size (VmHWM) while `f` ran
  std::string error;       // what() of an exception, empty when the call returned
  // What `f` added: the baseline is what the test process holds already (much more under
  // ASan, whose allocator keeps freed memory), shared with the child after fork.
  uint64_t grown() const { return peak_rss > start_rss ? peak_rss - start_rss : 0; }
};

uint64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  }
  return 0;
}

// Runs `f` in a forked child: its time and its peak resident memory (the child's high-water
// mark is reset to its resident size first, so the parent's earlier peaks do not count).
template <typename F>
ChildRun in_child(F f) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    { std::ofstream("/proc/self/clear_refs") << "5"; }  // VmHWM := VmRSS
    const uint64_t start = status_kb("VmRSS:") * 1024;
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string msg = std::to_string(secs) + " " + std::to_string(start) + " " +
                            std::to_string(status_kb("VmHWM:") * 1024) + " " + error;
    (void)!::write(fds[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ChildRun r;
  std::istringstream in(msg);
  in >> r.seconds >> r.start_rss >> r.peak_rss;
  std::getline(in, r.error);
  if (!r.error.empty() && r.error[0] == ' ') r.error.erase(0, 1);
  return r;
}

std::vector<std::string> folder(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

ReadOptions raw_options(RawSpec spec) {
  ReadOptions o;
  o.raw = std::move(spec);
  return o;
}

Array sample() {
  std::vector<uint8_t> b(4 * 6);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 11 + 3);
  return Array::owned(DType::kF32, {2, 3}, b);
}

TEST(TensorFile, DetectsFormatFromContentNotExtensionD12) {
  test::TempDir d;
  write_npy(d / "npy.bin", sample());  // misleading extensions on purpose
  write_npz(d / "npz.dat", {{"a", sample()}}, false);
  write_safetensors(d / "st.npy", {{"a", sample()}}, {});
  write_idx(d / "idx.txt", IdxArray{DType::kU8, {2, 2}, {1, 2, 3, 4}}, false);
  write_idx(d / "idxgz.npy", IdxArray{DType::kU8, {2, 2}, {1, 2, 3, 4}}, true);
  test::write_text(d / "t.bin", "1 2 3\n4 5 6\n");
  test::write_text(d / "raw.npy", std::string("\x01\xff\x80\x7f\x00\x10\x20\x30", 8));
  EXPECT_EQ(detect_file_format(d / "npy.bin"), Format::kNpy);
  EXPECT_EQ(detect_file_format(d / "npz.dat"), Format::kNpz);
  EXPECT_EQ(detect_file_format(d / "st.npy"), Format::kSafetensors);
  EXPECT_EQ(detect_file_format(d / "idx.txt"), Format::kIdx);
  bool gz = false;
  EXPECT_EQ(detect_file_format(d / "idxgz.npy", &gz), Format::kIdx);
  EXPECT_TRUE(gz);
  EXPECT_EQ(detect_file_format(d / "t.bin"), Format::kText);
  EXPECT_EQ(detect_file_format(d / "raw.npy"), Format::kUnknown);
  EXPECT_EQ(read_tensors(d / "idxgz.npy").arrays[0].array.numel(), 4);
  // A raw file without a declared dtype: the message says how to read it.
  expect_bad_input([&] { read_tensors(d / "raw.npy"); }, {"raw.npy", "cannot tell the format", "--dtype", "--shape"});
  // np.fromfile on an .npy is the classic mistake: --dtype on a file with a header is refused.
  ReadOptions raw;
  raw.raw = RawSpec{DType::kF32, {-1}};
  expect_bad_input([&] { read_tensors(d / "npy.bin", raw); }, {"is a npy file", "states its own dtype"});
  EXPECT_EQ(read_tensors(d / "raw.npy", raw_options(RawSpec{DType::kU16, {-1}})).arrays[0].array.numel(), 4);
}

TEST(TensorFile, ConversionsRoundTripBitExact) {
  test::TempDir d;
  TensorSet set;
  set.arrays.push_back({"w", sample()});
  const std::vector<uint8_t> want = sample().c_order_bytes();
  // npy → safetensors → npz (deflated) → raw → npy, each read back from disk.
  write_tensors(d / "a.npy", Format::kNpy, set);
  TensorSet s1 = read_tensors(d / "a.npy");
  write_tensors(d / "b.safetensors", Format::kSafetensors, s1);
  TensorSet s2 = read_tensors(d / "b.safetensors");
  EXPECT_EQ(s2.arrays[0].name, "a");  // single-array files are named after the file
  write_tensors(d / "c.npz", Format::kNpz, s2, WriteOptions{true, {}});
  TensorSet s3 = read_tensors(d / "c.npz");
  write_tensors(d / "d.bin", Format::kRaw, s3);
  TensorSet s4 = read_tensors(d / "d.bin", raw_options(RawSpec{DType::kF32, {2, 3}}));
  write_tensors(d / "e.npy", Format::kNpy, s4);
  TensorSet s5 = read_tensors(d / "e.npy");
  EXPECT_EQ(s5.arrays[0].array.c_order_bytes(), want);
  EXPECT_EQ(s5.arrays[0].array.shape_string(), "[2, 3]");
  // Two arrays into a single-array format: refused with the names.
  TensorSet two = set;
  two.arrays.push_back({"v", sample()});
  expect_bad_input([&] { write_tensors(d / "x.npy", Format::kNpy, two); }, {"holds one array", "w, v", "--name"});
  expect_bad_input([&] { format_for_extension("out.h5"); }, {".h5", ".safetensors"});
}

TEST(TensorFile, StatsCountNanAndInf) {
  std::vector<float> v = {1.0f, -3.0f, NAN, INFINITY, 5.0f};
  std::vector<uint8_t> b(20);
  std::memcpy(b.data(), v.data(), 20);
  ArrayStats s = array_stats(Array::owned(DType::kF32, {5}, b), "x");
  EXPECT_EQ(s.min, -3.0);
  EXPECT_EQ(s.max, 5.0);
  EXPECT_EQ(s.mean, 1.0);
  EXPECT_EQ(s.nan, 1);
  EXPECT_EQ(s.inf, 1);
}

// --- issue 10: archives that inflate ----------------------------------------------------------

TEST(TensorFile, InspectReadsOnlyTheHeaderOfAnNpzMemberThatInflatesTo2GiB) {
  test::TempDir d;
  const std::string path = d / "big.npz";
  const uint64_t n = (uint64_t{2} << 30) / 4;  // float32: 2 GiB of data
  zeros_npz(path, "x", DType::kF32, n);
  EXPECT_LT(fs::file_size(path), 3 * kMiB);
  TensorSetInfo info;
  const ChildRun run = in_child([&] { info = inspect_tensors(path); });
  EXPECT_EQ(run.error, "");
  EXPECT_LT(run.seconds, 1.0);
  EXPECT_LT(run.grown(), 100 * kMiB) << "peak RSS " << run.peak_rss << " from " << run.start_rss;
  std::printf("[ measured ] inspect of a %ju-byte npz inflating to 2 GiB: %.3f s, peak RSS %.1f MiB (+%.1f MiB)\n",
              static_cast<uintmax_t>(fs::file_size(path)), run.seconds, static_cast<double>(run.peak_rss) / kMiB,
              static_cast<double>(run.grown()) / kMiB);
  info = inspect_tensors(path);
  ASSERT_EQ(info.arrays.size(), 1u);
  EXPECT_EQ(info.format, Format::kNpz);
  EXPECT_EQ(info.arrays[0].name, "x");
  EXPECT_EQ(info.arrays[0].dtype, DType::kF32);
  EXPECT_EQ(info.arrays[0].shape, (std::vector<int64_t>{static_cast<int64_t>(n)}));
  EXPECT_EQ(info.arrays[0].nbytes, uint64_t{2} << 30);
  // No budget applies to headers; the full read is refused before it inflates anything.
  ReadOptions small;
  small.memory_budget = 16 * kMiB;
  EXPECT_EQ(inspect_tensors(path, small).arrays[0].nbytes, uint64_t{2} << 30);
  ReadOptions gib;
  gib.memory_budget = uint64_t{1} << 30;
  const ChildRun refused = in_child([&] { read_tensors(path, gib); });
  EXPECT_LT(refused.seconds, 1.0);
  EXPECT_LT(refused.grown(), 100 * kMiB);
  for (const char* needle : {"big.npz:x.npy inflates to 2147483776 bytes (2.0 GiB) from ", " KiB compressed",
                             "over the memory budget of 1073741824 bytes (1.0 GiB)", "--memory-budget-mb"}) {
    test::expect_contains(refused.error, needle);
  }
}

TEST(TensorFile, ReadAndConvertOverTheMemoryBudgetAreRefusedAndWriteNothing) {
  test::TempDir d;
  const std::string path = d / "big.npz";
  zeros_npz(path, "x", DType::kU8, 64 * kMiB);
  ReadOptions budget;
  budget.memory_budget = 16 * kMiB;
  expect_bad_input([&] { read_tensors(path, budget); },
                   {"big.npz:x.npy", "inflates to 67108992 bytes (64.0 MiB) from ", "KiB compressed",
                    "memory budget of 16777216 bytes (16.0 MiB)", "--memory-budget-mb"});
  expect_bad_input([&] { read_npz(path, nullptr, 16 * kMiB); }, {"big.npz:x.npy", "67108992 bytes"});
  // npy and raw stream, npz and safetensors read into memory: the budget holds for every path,
  // and is checked before the output is created.
  for (const char* out : {"out.npy", "out.bin", "out.npz", "out.safetensors", "out.txt"}) {
    expect_bad_input([&] { convert_tensors(path, d / out, format_for_extension(out), budget); },
                     {"big.npz:x.npy", "67108992 bytes", "16777216 bytes"});
  }
  EXPECT_EQ(folder(d.path()), std::vector<std::string>{"big.npz"});
  // The budget counts every member one read inflates: 10 + 10 MiB against 16 MiB.
  write_zip(d / "two.npz", {{"a.npy", deflate_zeros(header_for(DType::kU8, {10 << 20}), 10 * kMiB)},
                            {"b.npy", deflate_zeros(header_for(DType::kU8, {10 << 20}), 10 * kMiB)}});
  expect_bad_input([&] { read_tensors(d / "two.npz", budget); },
                   {"two.npz:b.npy", "10485888 bytes", "with 10485888 bytes already inflated by this read"});
  ReadOptions only_a = budget;
  only_a.name = "a";  // a member not chosen is not inflated
  EXPECT_EQ(read_tensors(d / "two.npz", only_a).arrays.at(0).array.nbytes(), 10 * kMiB);
  // Within the budget it reads.
  budget.memory_budget = 65 * kMiB;
  EXPECT_EQ(read_tensors(path, budget).arrays.at(0).array.nbytes(), 64 * kMiB);
  // 0 is the default: half the physical memory.
  EXPECT_GT(physical_memory_bytes(), 0u);
  EXPECT_EQ(MemoryBudget(0).limit(), physical_memory_bytes() / 2);
}

TEST(TensorFile, NpzMemberWhoseHeaderDisagreesWithTheZipDirectoryIsRefused) {
  test::TempDir d;
  // The header claims 1000 float32 (4000 bytes), the member holds 100 bytes of data.
  write_zip(d / "more.npz", {{"x.npy", deflate_zeros(header_for(DType::kF32, {1000}), 100)}});
  for (int i = 0; i < 3; ++i) {
    expect_bad_input(
        [&] {
          if (i == 0) inspect_tensors(d / "more.npz");
          if (i == 1) read_tensors(d / "more.npz");
          if (i == 2) convert_tensors(d / "more.npz", d / "x.npy", Format::kNpy);
        },
        {"more.npz:x.npy", "shape (1000) of float32", "4000 data bytes",
         "the zip directory says the member holds 228 bytes"});
  }
  // Fewer than the member holds: trailing bytes are as wrong.
  write_zip(d / "less.npz", {{"x.npy", deflate_zeros(header_for(DType::kF32, {10}), 400)}});
  expect_bad_input([&] { inspect_tensors(d / "less.npz"); }, {"less.npz:x.npy", "40 data bytes", "holds 528 bytes"});
  // A header length past the 1 MiB bound is refused before it is read.
  std::string huge("\x93NUMPY\x02\x00", 8);
  put(huge, 2 * kMiB, 4);
  write_zip(d / "hdr.npz", {{"x.npy", deflate_zeros(huge, 4 * kMiB)}});
  expect_bad_input([&] { inspect_tensors(d / "hdr.npz"); }, {"hdr.npz:x.npy", "header length 2097152", "1 MiB limit"});
  // The directory declares more than the deflate stream holds (and the header agrees with the
  // directory): headers pass, reading and converting fail and leave no output.
  ZipEntry cut{"x.npy", deflate_zeros(header_for(DType::kU8, {3 << 20}), 2 * kMiB), 128 + 3 * kMiB};
  write_zip(d / "cut.npz", {cut});
  EXPECT_EQ(inspect_tensors(d / "cut.npz").arrays.at(0).nbytes, 3 * kMiB);
  expect_bad_input([&] { read_tensors(d / "cut.npz"); }, {"cut.npz:x.npy"});
  expect_bad_input([&] { convert_tensors(d / "cut.npz", d / "cut.npy", Format::kNpy); }, {"cut.npz:x.npy"});
  EXPECT_FALSE(fs::exists(d / "cut.npy"));
  for (const auto& f : folder(d.path())) EXPECT_FALSE(is_atomic_temp_name(f)) << f;
}

TEST(TensorFile, StreamingConvertWritesWhatTheInMemoryPathWrites) {
  test::TempDir d;
  // NumPy writes the archives: C and Fortran order, both byte orders, 0-d, empty, bool, and a
  // member over the 1 MiB chunk.
  test::run_python("import numpy as np\n"
                   "i = np.arange(1_500_000, dtype=np.uint64)\n"
                   "m = dict(a=np.arange(12, dtype='<f4').reshape(3, 4),\n"
                   "         be=np.arange(6, dtype='>i8').reshape(2, 3),\n"
                   "         f=np.asfortranarray(np.arange(6.0).reshape(2, 3)), z=np.array(3.5),\n"
                   "         e=np.zeros((0, 3), 'u1'), bo=np.array([True, False, True]),\n"
                   "         big=((i * 2654435761) >> 7).astype('<u2').reshape(1000, 1500),\n"
                   "         c=np.array([1 + 2j, 3 - 4j], '<c8'))\n"
                   "np.savez_compressed('" + (d / "c.npz") + "', **m)\n"
                   "np.savez('" + (d / "s.npz") + "', **m)\n");
  write_npz(d / "w.npz", {{"w", sample()}}, true);
  int converted = 0;
  for (const char* in : {"c.npz", "s.npz", "w.npz"}) {
    for (const char* name : {"a", "be", "f", "z", "e", "bo", "big", "c", "w"}) {
      if ((std::string(in) == "w.npz") != (std::string(name) == "w")) continue;
      for (const char* ext : {"npy", "bin"}) {
        ReadOptions r;
        r.name = name;
        const std::string s = d / (std::string("s_") + name + "." + ext);
        const std::string m = d / (std::string("m_") + name + "." + ext);
        const Format f = format_for_extension(s);
        const TensorSetInfo info = convert_tensors(d / in, s, f, r);
        write_tensors(m, f, read_tensors(d / in, r));
        EXPECT_EQ(test::read_text(s), test::read_text(m)) << in << " " << name << " " << ext;
        ASSERT_EQ(info.arrays.size(), 1u);
        EXPECT_EQ(info.arrays[0].name, name);
        ++converted;
      }
    }
  }
  EXPECT_EQ(converted, 2 * 8 * 2 + 2);
  // NumPy reads the streamed copy of the multi-chunk member as the original.
  EXPECT_EQ(test::run_python("import numpy as np\n"
                             "print(np.array_equal(np.load('" + (d / "s_big.npy") + "'), np.load('" + (d / "c.npz") +
                             "')['big']))\n"),
            "True\n");
  // Several arrays into one-array formats: refused before anything is inflated; to npz and
  // safetensors (in memory) as write_tensors writes them.
  expect_bad_input([&] { convert_tensors(d / "c.npz", d / "all.npy", Format::kNpy); }, {"holds one array", "a, be, f"});
  for (const char* ext : {"npz", "safetensors"}) {
    ReadOptions r;
    r.name = "big";
    const std::string s = d / (std::string("s.") + ext), m = d / (std::string("m.") + ext);
    convert_tensors(d / "c.npz", s, format_for_extension(s), r);
    write_tensors(m, format_for_extension(m), read_tensors(d / "c.npz", r));
    EXPECT_EQ(test::read_text(s), test::read_text(m)) << ext;
  }
  ReadOptions missing;
  missing.name = "nope";
  expect_bad_input([&] { convert_tensors(d / "c.npz", d / "n.npy", Format::kNpy, missing); },
                   {"no array named 'nope'", "a, be, f, z, e, bo, big, c"});
}

TEST(TensorFile, StreamingConvertOfA512MiBMemberStaysSmall) {
  test::TempDir d;
  const std::string path = d / "big.npz";
  const uint64_t n = 256 * kMiB;  // uint16: 512 MiB of data
  zeros_npz(path, "x", DType::kU16, n);
  ReadOptions r;
  r.memory_budget = uint64_t{1} << 30;
  const ChildRun run = in_child([&] { convert_tensors(path, d / "x.npy", Format::kNpy, r); });
  EXPECT_EQ(run.error, "");
  EXPECT_LT(run.grown(), 100 * kMiB) << "peak RSS " << run.peak_rss << " from " << run.start_rss;
  std::printf("[ measured ] convert npz → npy of a member inflating to 512 MiB: %.3f s, peak RSS %.1f MiB "
              "(+%.1f MiB)\n",
              run.seconds, static_cast<double>(run.peak_rss) / kMiB, static_cast<double>(run.grown()) / kMiB);
  // The output is NumPy's header then the 512 MiB of zeros (checked through a mapping).
  const std::string header = header_for(DType::kU16, {static_cast<int64_t>(n)});
  auto out = MappedFile::open(d / "x.npy");
  ASSERT_EQ(out->size(), header.size() + 2 * n);
  EXPECT_EQ(std::memcmp(out->data(), header.data(), header.size()), 0);
  const std::vector<uint8_t> zero(kMiB, 0);
  bool all_zero = true;
  for (uint64_t off = header.size(); off < out->size(); off += kMiB) {
    all_zero &= std::memcmp(out->data() + off, zero.data(), std::min<uint64_t>(kMiB, out->size() - off)) == 0;
  }
  EXPECT_TRUE(all_zero);
  EXPECT_EQ(folder(d.path()), (std::vector<std::string>{"big.npz", "x.npy"}));
}

TEST(TensorFile, GzipIdxInspectReadsTheHeaderAndReadIsBudgeted) {
  test::TempDir d;
  const std::string path = d / "big-idx3-ubyte.gz";
  zeros_gzip_idx(path, 256, 1024, 1024);  // 256 MiB of u8
  TensorSetInfo info;
  const ChildRun run = in_child([&] { info = inspect_tensors(path); });
  EXPECT_EQ(run.error, "");
  EXPECT_LT(run.seconds, 1.0);
  EXPECT_LT(run.grown(), 100 * kMiB) << "peak RSS " << run.peak_rss << " from " << run.start_rss;
  std::printf("[ measured ] inspect of a gzip IDX inflating to 256 MiB: %.3f s, peak RSS %.1f MiB (+%.1f MiB)\n",
              run.seconds, static_cast<double>(run.peak_rss) / kMiB, static_cast<double>(run.grown()) / kMiB);
  info = inspect_tensors(path);
  ASSERT_EQ(info.arrays.size(), 1u);
  EXPECT_EQ(info.format, Format::kIdx);
  EXPECT_EQ(info.arrays[0].dtype, DType::kU8);
  EXPECT_EQ(info.arrays[0].shape, (std::vector<int64_t>{256, 1024, 1024}));
  EXPECT_EQ(info.arrays[0].nbytes, 256 * kMiB);
  ReadOptions budget;
  budget.memory_budget = 16 * kMiB;
  expect_bad_input([&] { read_tensors(path, budget); },
                   {"big-idx3-ubyte.gz inflates to 268435472 bytes (256.0 MiB) from ", "KiB compressed",
                    "memory budget of 16777216 bytes (16.0 MiB)", "--memory-budget-mb"});
  expect_bad_input([&] { read_idx(path, 16 * kMiB); }, {"big-idx3-ubyte.gz", "268435472 bytes"});
  // Within the budget the data is held once (inflated in place, not copied).
  budget.memory_budget = 512 * kMiB;
  const ChildRun full = in_child([&] {
    if (read_tensors(path, budget).arrays.at(0).array.nbytes() != 256 * kMiB) throw std::runtime_error("wrong size");
  });
  EXPECT_EQ(full.error, "");
  EXPECT_LT(full.grown(), 256 * kMiB + 100 * kMiB) << "peak RSS " << full.peak_rss << " from " << full.start_rss;
}

}  // namespace
}  // namespace crucible::io
