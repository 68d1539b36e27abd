// `crucible inspect` and `crucible convert` end to end: format from content, JSON output and
// stats, conversions NumPy reads back, exit code 2 with a precise message for bad input.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "crucible/io/dtype.h"
#include "test_util.h"
#include "zeros_archive.h"

namespace crucible {
namespace {

using nlohmann::json;

using test::expect_contains;

TEST(IoCli, InspectNpzAsJsonWithStats) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "a = np.array([[1.0, np.nan], [np.inf, -2.0]], dtype='<f4')\n"
                   "np.savez(open('" + (d / "x.data") + "', 'wb'), a=a, b=np.arange(5, dtype='>i2'))\n");
  auto r = test::run_command({test::crucible_binary(), "inspect", d / "x.data", "--json", "--stats"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["format"], "npz");
  ASSERT_EQ(j["arrays"].size(), 2u);
  EXPECT_EQ(j["arrays"][0]["name"], "a");
  EXPECT_EQ(j["arrays"][0]["dtype"], "float32");
  EXPECT_EQ(j["arrays"][0]["shape"], json::array({2, 2}));
  EXPECT_EQ(j["arrays"][0]["stats"]["nan"], 1);
  EXPECT_EQ(j["arrays"][0]["stats"]["inf"], 1);
  EXPECT_EQ(j["arrays"][0]["stats"]["min"], -2.0);
  EXPECT_EQ(j["arrays"][1]["dtype"], "int16");
  EXPECT_EQ(j["arrays"][1]["stats"]["max"], 4.0);
  // The human table names every array.
  r = test::run_command({test::crucible_binary(), "inspect", d / "x.data"});
  EXPECT_EQ(r.exit_code, 0);
  expect_contains(r.out, "npz, 2 array(s)");
  expect_contains(r.out, "[2, 2]");
}

TEST(IoCli, RawNeedsDtypeAndSizeMustMatchD12) {
  test::TempDir d;
  test::run_python("import numpy as np\nnp.arange(40, dtype='<f4').tofile('" + (d / "scan.bin") + "')\n");
  auto r = test::run_command({test::crucible_binary(), "inspect", d / "scan.bin"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "scan.bin");
  expect_contains(r.err, "--dtype");
  r = test::run_command({test::crucible_binary(), "inspect", d / "scan.bin", "--dtype", "float32", "--shape", "-1,4"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "[10, 4]");
  r = test::run_command({test::crucible_binary(), "inspect", d / "scan.bin", "--dtype", "float64", "--shape", "-1,3"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "160 bytes");
  r = test::run_command({test::crucible_binary(), "inspect", d / "scan.bin", "--dtype", "float33"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "float33");
}

TEST(IoCli, ConvertChainNumpyReadsBack) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.arange(40, dtype='<f4').tofile('" + (d / "scan.bin") + "')\n");
  auto ok = [&](std::vector<std::string> args) {
    args.insert(args.begin(), test::crucible_binary());
    auto r = test::run_command(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  ok({"convert", d / "scan.bin", d / "scan.npy", "--dtype", "float32", "--shape", "-1,4"});
  ok({"convert", d / "scan.npy", d / "scan.safetensors"});
  ok({"convert", d / "scan.safetensors", d / "scan.npz", "--compress"});
  ok({"convert", d / "scan.npz", d / "scan.csv"});
  ok({"convert", d / "scan.csv", d / "back.npy"});
  EXPECT_EQ(test::run_python("import numpy as np\n"
                             "a = np.arange(40, dtype='<f4').reshape(10, 4)\n"
                             "z = np.load('" + (d / "scan.npz") + "')\n"
                             "b = np.load('" + (d / "back.npy") + "')\n"
                             "print(z.files, (z['scan'] == a).all(), b.dtype, (b == a).all())\n"),
            "['scan'] True float64 True\n");
  auto r = test::run_command({test::crucible_binary(), "convert", d / "scan.npy", d / "out.h5"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, ".h5");
  r = test::run_command({test::crucible_binary(), "convert", d / "scan.npz", d / "one.npy", "--name", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "no array named 'nope'");
}

TEST(IoCli, TruncatedFilesExitTwoNamingFileAndOffset) {
  test::TempDir d;
  test::run_python("import numpy as np\n"
                   "np.save('" + (d / "a.npy") + "', np.zeros((100, 100)))\n"
                   "b = open('" + (d / "a.npy") + "', 'rb').read()\n"
                   "open('" + (d / "cut.npy") + "', 'wb').write(b[:5000])\n");
  auto r = test::run_command({test::crucible_binary(), "inspect", d / "cut.npy"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "cut.npy");
  expect_contains(r.err, "byte 128");
  expect_contains(r.err, "needs 80000 data bytes");
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// X4 / T13: a DDP-wrapped checkpoint converts to safetensors with clean names, every tensor
// equal to PyTorch's; non-tensor values are listed, never silently dropped.
TEST(IoCli, ConvertPtStateDictToSafetensors) {
  test::TempDir d;
  test::run_python("import torch\n"
                   "torch.manual_seed(0)\n"
                   "m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))\n"
                   "torch.save({'model': torch.nn.DataParallel(m).state_dict(), 'epoch': 7}, '" + (d / "ckpt.pt") + "')\n"
                   "torch.save(m.state_dict(), '" + (d / "ref.pt") + "')\n");
  auto r = test::run_command({test::crucible_binary(), "convert", d / "ckpt.pt", d / "out.safetensors"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, "module.");
  expect_contains(r.out, "epoch: int 7");
  const std::string out = test::run_python(
      test::python_read_safetensors(d / "out.safetensors") +
      "import torch\n"
      "ref = torch.load('" + (d / "ref.pt") + "')\n"
      "ok = sorted(k for k in h if k != '__metadata__') == sorted('model.' + k for k in ref)\n"
      "for k, t in ref.items():\n"
      "    s, e = h['model.' + k]['data_offsets']\n"
      "    ok &= b[8+n+s:8+n+e] == t.contiguous().numpy().tobytes()\n"
      "print(ok)\n");
  EXPECT_EQ(out, "True\n");
}

// A pickle that would run os.system is refused by name and runs nothing.
TEST(IoCli, MaliciousPickleIsRefusedAndHasNoEffect) {
  test::TempDir d;
  test::run_python("import torch, os\n"
                   "class Evil:\n"
                   "    def __reduce__(self):\n"
                   "        return (os.system, ('touch " + (d / "pwned") + "',))\n"
                   "torch.save({'w': torch.ones(2), 'x': Evil()}, '" + (d / "evil.pt") + "')\n");
  auto r = test::run_command({test::crucible_binary(), "inspect", d / "evil.pt"});
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r.err, "system");
  expect_contains(r.err, "refused global");
  EXPECT_FALSE(std::ifstream(d / "pwned").good());
}

// Issue 10: a 2 MB .npz whose one member inflates to 2 GiB. inspect reads only the member's
// header (small and quick: its peak memory is asserted, its time printed); convert refuses it
// under a 1 GiB budget, naming the member and both sizes, and writes nothing; under a budget
// that allows it, convert to .npy streams (small peak memory) and NumPy reads the result.
TEST(IoCli, ArchiveThatInflatesTo2GiBIsInspectedSmallAndBudgetedOnConvert) {
  test::TempDir d;
  const std::string npz = d / "bomb.npz";
  const uint64_t n = (uint64_t{2} << 30) / 4;  // float32 zeros: 2 GiB of data
  test::zeros_npz(npz, "x", io::DType::kF32, n);
  std::printf("bomb.npz: %lld bytes on disk\n", static_cast<long long>(std::ifstream(npz, std::ios::ate).tellg()));

  auto r = test::run_command({test::crucible_binary(), "inspect", npz, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["arrays"].size(), 1u);
  EXPECT_EQ(j["arrays"][0]["name"], "x");
  EXPECT_EQ(j["arrays"][0]["dtype"], "float32");
  EXPECT_EQ(j["arrays"][0]["shape"], json::array({n}));
  EXPECT_EQ(j["arrays"][0]["nbytes"], n * 4);
  EXPECT_LT(r.max_rss_kb, 100 * 1024) << "inspect inflated the member?";
  std::printf("inspect: %.3f s, peak RSS %.1f MB\n", r.wall_seconds, r.max_rss_kb / 1024.0);

  r = test::run_command({test::crucible_binary(), "convert", npz, d / "out.safetensors", "--memory-budget-mb", "1024"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_contains(r.err, npz + ":x.npy");
  expect_contains(r.err, std::to_string(n * 4 + 128));  // the member: npy header + data
  expect_contains(r.err, "1073741824");                 // the budget
  expect_contains(r.err, "--memory-budget-mb");
  EXPECT_LT(r.max_rss_kb, 100 * 1024);
  std::printf("convert refused under 1 GiB: %.3f s, peak RSS %.1f MB\n", r.wall_seconds, r.max_rss_kb / 1024.0);
  EXPECT_FALSE(std::filesystem::exists(d / "out.safetensors"));
  for (const auto& e : std::filesystem::directory_iterator(d.path())) {
    EXPECT_TRUE(e.path().filename() == "bomb.npz") << "left behind: " << e.path();
  }
}

TEST(IoCli, ConvertStreamsAnNpzMemberToNpy) {
  test::TempDir d;
  const uint64_t n = (uint64_t{512} << 20) / 8;  // 512 MiB of float64 zeros
  test::zeros_npz(d / "big.npz", "x", io::DType::kF64, n);
  auto r = test::run_command({test::crucible_binary(), "convert", d / "big.npz", d / "big.npy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.max_rss_kb, 100 * 1024) << "convert held the member in memory";
  std::printf("convert 512 MiB member → npy: %.2f s, peak RSS %.1f MB\n", r.wall_seconds, r.max_rss_kb / 1024.0);
  EXPECT_EQ(test::run_python("import numpy as np\na = np.load('" + (d / "big.npy") +
                             "', mmap_mode='r')\nprint(a.dtype, a.shape, int(a[::65536].sum()))\n"),
            "float64 (" + std::to_string(n) + ",) 0\n");
}

}  // namespace
}  // namespace crucible
