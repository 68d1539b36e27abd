// PyTorch .pt reader: files written by Python's torch.save (the oracle) read tensor for tensor
// the same (dtype, shape, C-order bytes), and every refused or broken file is a precise
// bad-input error. To add a case: a torch.save file → a TEST comparing against describe(...)
// output; a crafted pickle → a row in CraftedPicklesFailPrecisely.
#include "crucible/io/pt.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::io {
namespace {

// Python lines: describe(d) prints [[name, dtype, shape, hex of the C-order little-endian
// bytes], ...] for a dict of tensors, in order (bfloat16 through int16: NumPy lacks it).
const char* kPyDescribe =
    "import json, os, torch\n"
    "torch.manual_seed(0)\n"
    "def raw(t):\n"
    "    t = t.detach().contiguous()\n"
    "    if t.dtype == torch.bfloat16: t = t.view(torch.int16)\n"
    "    return t.numpy().tobytes().hex()\n"
    "def describe(d):\n"
    "    print(json.dumps([[k, str(v.dtype).replace('torch.', ''), list(v.shape), raw(v)] for k, v in d.items()]))\n"
    "def model():\n"
    "    m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),\n"
    "                            torch.nn.Flatten(), torch.nn.Linear(4, 3))\n"
    "    m(torch.randn(5, 2, 3, 3))  # train mode: running stats and num_batches_tracked move\n"
    "    return m\n";

// Runs kPyDescribe, then `body` with D = the folder of `d` (ending in '/'); returns stdout.
std::string python(const test::TempDir& d, const std::string& body) {
  return test::run_python(std::string(kPyDescribe) + "D = '" + d.path() + "/'\n" + body);
}

std::string hex(const std::vector<uint8_t>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

// Expects `c.tensors` to be exactly the tensors Python described, in the same order.
void expect_tensors(const PtContents& c, const std::string& python_json) {
  const auto expected = nlohmann::json::parse(python_json);
  ASSERT_EQ(c.tensors.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const NamedArray& t = c.tensors[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, expected[i][0].get<std::string>());
    EXPECT_EQ(dtype_name(t.array.dtype), expected[i][1].get<std::string>());
    EXPECT_EQ(t.array.shape, expected[i][2].get<std::vector<int64_t>>());
    EXPECT_EQ(t.array.strides.size(), t.array.shape.size());
    EXPECT_EQ(hex(t.array.c_order_bytes()), expected[i][3].get<std::string>());
  }
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(Pt, ModelStateDictMatchesPyTorch) {
  test::TempDir d;
  const std::string out = python(d,
                                 "sd = model().state_dict()\n"
                                 "torch.save(sd, D + 'm.pt')\n"
                                 "describe(sd)\n");
  const PtContents c = read_pt(d / "m.pt");
  expect_tensors(c, out);
  ASSERT_EQ(c.tensors.size(), 9u);
  EXPECT_EQ(c.tensors[6].name, "1.num_batches_tracked");
  EXPECT_EQ(c.tensors[6].array.dtype, DType::kI64);
  EXPECT_TRUE(c.tensors[6].array.shape.empty());
  EXPECT_TRUE(c.skipped.empty());  // state_dict's _metadata (set by BUILD) is not content
  EXPECT_TRUE(c.notes.empty());
}

TEST(Pt, DataParallelPrefixIsStrippedAndReported) {
  test::TempDir d;
  const std::string out = python(d,
                                 "m = model()\n"
                                 "dp = torch.nn.DataParallel(m).state_dict()\n"
                                 "assert all(k.startswith('module.') for k in dp)\n"
                                 "torch.save(dp, D + 'dp.pt')\n"
                                 "describe(m.state_dict())\n");
  const PtContents c = read_pt(d / "dp.pt");
  expect_tensors(c, out);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "stripped the DDP prefix 'module.' from 9 names (X4)");
}

TEST(Pt, NestedCheckpointFlattensWithSkippedValues) {
  test::TempDir d;
  const std::string out = python(d,
                                 "m = model()\n"
                                 "opt = torch.optim.Adam(m.parameters(), lr=1e-3)\n"
                                 "m(torch.randn(5, 2, 3, 3)).sum().backward()\n"
                                 "opt.step()\n"
                                 "ck = {'model': m.state_dict(), 'optimizer': opt.state_dict(), 'epoch': 3}\n"
                                 "torch.save(ck, D + 'ck.pt')\n"
                                 "flat = {'model.' + k: v for k, v in ck['model'].items()}\n"
                                 "for i, st in ck['optimizer']['state'].items():\n"
                                 "    flat.update({'optimizer.state.%d.%s' % (i, k): v for k, v in st.items()})\n"
                                 "describe(flat)\n");
  const PtContents c = read_pt(d / "ck.pt");
  expect_tensors(c, out);
  EXPECT_TRUE(contains(c.skipped, "epoch: int 3"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.lr: float 0.001"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.betas.1: float 0.999"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.eps: float 1e-08"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.amsgrad: bool False"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.foreach: None"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.params.0: int 0"));
  EXPECT_TRUE(contains(c.skipped, "optimizer.param_groups.0.params.5: int 5"));
  EXPECT_TRUE(c.notes.empty());
}

TEST(Pt, EveryDtypeMatchesPyTorch) {
  test::TempDir d;
  const std::string out =
      python(d,
             "x = torch.randn(2, 3) * 100\n"
             "t = {'f32': x, 'f64': x.double(), 'f16': x.half(), 'bf16': x.bfloat16(),\n"
             "     'i64': x.long() * 1000003, 'i32': x.int(), 'i16': x.short(),\n"
             "     'i8': x.to(torch.int8), 'u8': x.to(torch.uint8), 'bool': x > 0,\n"
             "     'c64': torch.complex(x, -x), 'c128': torch.complex(x.double(), x.double() / 3),\n"
             "     'param': torch.nn.Parameter(x[0].clone())}  # _rebuild_parameter\n"
             "torch.save(t, D + 'dtypes.pt')\n"
             "torch.save(t, D + 'dtypes4.pt', pickle_protocol=4)\n"
             "torch.save(t, D + 'dtypes5.pt', pickle_protocol=5)\n"
             "describe(t)\n");
  for (const char* f : {"dtypes.pt", "dtypes4.pt", "dtypes5.pt"}) {  // protocol 4+: FRAME, MEMOIZE, STACK_GLOBAL
    SCOPED_TRACE(f);
    const PtContents c = read_pt(d / f);
    expect_tensors(c, out);
    EXPECT_TRUE(c.skipped.empty());
  }
}

TEST(Pt, SharedStorageReadsAsViews) {
  test::TempDir d;
  const std::string out = python(d,
                                 "a = torch.arange(12.)\n"
                                 "t = {'a': a, 'v': a[2:5], 't': a.view(3, 4).t()}\n"
                                 "torch.save(t, D + 'views.pt')\n"
                                 "describe(t)\n");
  const PtContents c = read_pt(d / "views.pt");
  expect_tensors(c, out);
  ASSERT_EQ(c.tensors.size(), 3u);
  const Array& a = c.tensors[0].array;
  const Array& v = c.tensors[1].array;
  const Array& t = c.tensors[2].array;
  EXPECT_EQ(v.data, a.data + 2 * sizeof(float));  // the same bytes, not copies
  EXPECT_EQ(t.data, a.data);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(t.strides, (std::vector<int64_t>{1, 4}));
  EXPECT_FALSE(t.is_c_contiguous());
  EXPECT_EQ(a.owner, v.owner);
  float v0;
  std::memcpy(&v0, v.data, sizeof v0);
  EXPECT_EQ(v0, 2.0f);
}

TEST(Pt, ZeroDimAndEmptyTensors) {
  test::TempDir d;
  const std::string out = python(d,
                                 "t = {'s': torch.tensor(2.5), 'e': torch.zeros(0, 3), 'n': torch.empty(0)}\n"
                                 "torch.save(t, D + 'z.pt')\n"
                                 "torch.save(torch.tensor([1, 2], dtype=torch.int32), D + 'one.pt')\n"
                                 "describe(t)\n");
  const PtContents c = read_pt(d / "z.pt");
  expect_tensors(c, out);
  ASSERT_EQ(c.tensors.size(), 3u);
  EXPECT_TRUE(c.tensors[0].array.shape.empty());
  EXPECT_EQ(c.tensors[0].array.numel(), 1);
  EXPECT_EQ(c.tensors[1].array.numel(), 0);
  const PtContents one = read_pt(d / "one.pt");  // a bare tensor is named "tensor"
  ASSERT_EQ(one.tensors.size(), 1u);
  EXPECT_EQ(one.tensors[0].name, "tensor");
  EXPECT_EQ(one.tensors[0].array.dtype, DType::kI32);
}

TEST(Pt, ParseFromMemoryViewsTheBuffer) {
  test::TempDir d;
  python(d, "torch.save(model().state_dict(), D + 'm.pt')\n");
  auto bytes = std::make_shared<std::string>(test::read_text(d / "m.pt"));
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes->data());
  const PtContents c = parse_pt(begin, bytes->size(), "m.pt", bytes);
  ASSERT_EQ(c.tensors.size(), 9u);
  for (const NamedArray& t : c.tensors) {  // torch.save stores members uncompressed: no copies
    EXPECT_GE(t.array.data, begin) << t.name;
    EXPECT_LE(t.array.data + t.array.nbytes(), begin + bytes->size()) << t.name;
    EXPECT_EQ(t.array.owner.get(), bytes.get()) << t.name;
  }
}

TEST(Pt, RezippedBigEndianAndCudaFilesRead) {
  // Python's zipfile writes unaligned (deflated or stored) members; a big-endian writer's file
  // has byteorder 'big' and swapped elements; a GPU file has location 'cuda:0'.
  test::TempDir d;
  const std::string out =
      python(d,
             "import zipfile, numpy as np, torch.serialization as ser\n"
             "x = torch.randn(3, 5)\n"
             "t = {'f32': x, 'i64': x.long(), 'f16': x.half(), 'bf16': x.bfloat16(), 'c64': torch.complex(x, x * 2),\n"
             "     'c128': torch.complex(x, x).double(), 'bool': x > 0, 'slice': x.t()[1:]}\n"
             "assert list(t) == ['f32', 'i64', 'f16', 'bf16', 'c64', 'c128', 'bool', 'slice']\n"
             "swap = [4, 8, 2, 2, 4, 8, 1]  # bytes reversed per element of storage '0'..'6' (complex: per half)\n"
             "torch.save(t, D + 'le.pt')\n"
             "with zipfile.ZipFile(D + 'le.pt') as zin:\n"
             "    names = zin.namelist()\n"
             "    with zipfile.ZipFile(D + 'deflated.pt', 'w', zipfile.ZIP_DEFLATED) as z:\n"
             "        for n in names: z.writestr(n, zin.read(n))\n"
             "    with zipfile.ZipFile(D + 'big.pt', 'w') as z:\n"
             "        for n in names:\n"
             "            b = zin.read(n)\n"
             "            if '/data/' in n:\n"
             "                w = swap[int(n.rsplit('/', 1)[1])]\n"
             "                b = np.frombuffer(b, 'u%d' % w).byteswap().tobytes() if w > 1 else b\n"
             "            z.writestr(n, b)\n"
             "        z.writestr(names[0].split('/')[0] + '/byteorder', 'big')\n"
             "ser.location_tag = lambda s: 'cuda:0'\n"
             "torch.save(t, D + 'cuda.pt')\n"
             "describe(t)\n");
  for (const char* f : {"le.pt", "deflated.pt", "big.pt", "cuda.pt"}) {
    SCOPED_TRACE(f);
    const PtContents c = read_pt(d / f);
    expect_tensors(c, out);
    ASSERT_EQ(c.tensors.size(), 8u);
    EXPECT_EQ(c.tensors[7].array.data, c.tensors[0].array.data + sizeof(float));  // still a view
    if (std::string(f) == "cuda.pt") {
      EXPECT_EQ(c.notes, (std::vector<std::string>{"storages saved on cuda:0 read to CPU (T13)"}));
    } else {
      EXPECT_TRUE(c.notes.empty());
    }
  }
}

TEST(PtRefuses, MaliciousPickleWithoutRunningIt) {
  test::TempDir d;
  const std::string marker = d / "marker";
  python(d,
         "import os\n"
         "class Evil:\n"
         "    def __reduce__(self): return (os.system, ('touch ' + D + 'marker',))\n"
         "torch.save({'w': torch.ones(2), 'x': Evil()}, D + 'evil.pt')\n");
  ASSERT_FALSE(exists(marker));
  test::expect_bad_input([&] { read_pt(d / "evil.pt"); },
                         {"evil.pt", "refused global 'posix.system' at pickle byte",
                          "only state_dict contents (tensors, containers, numbers, strings) are loaded"});
  EXPECT_FALSE(exists(marker));
}

TEST(PtRefuses, TruncatedNonZipTorchScriptAndLegacyFiles) {
  test::TempDir d;
  python(d,
         "m = torch.nn.Linear(2, 2)\n"
         "torch.save(m.state_dict(), D + 'm.pt')\n"
         "torch.save(m.state_dict(), D + 'code.pt')  # its folder is code/, yet not TorchScript\n"
         "torch.save(m.state_dict(), D + 'legacy.pt', _use_new_zipfile_serialization=False)\n"
         "torch.jit.save(torch.jit.script(m), D + 'script.pt')\n");
  const std::string raw = test::read_text(d / "m.pt");
  for (size_t cut : {size_t{10}, size_t{200}, raw.size() / 2, raw.size() - 23, raw.size() - 1}) {
    SCOPED_TRACE(cut);
    test::write_text(d / "cut.pt", raw.substr(0, cut));
    test::expect_bad_input([&] { read_pt(d / "cut.pt"); }, {"cut.pt", "truncated"});
  }
  test::write_text(d / "text.pt", "hello, world");
  test::expect_bad_input([&] { read_pt(d / "text.pt"); }, {"text.pt", "not a torch.save file", "68 65 6c 6c"});
  test::write_text(d / "empty.pt", "");
  test::expect_bad_input([&] { read_pt(d / "empty.pt"); }, {"empty.pt", "empty file"});
  test::expect_bad_input([&] { read_pt(d / "script.pt"); },
                         {"script.pt", "TorchScript archive", "torch.jit.save", "not a state_dict"});
  EXPECT_EQ(read_pt(d / "code.pt").tensors.size(), 2u);
  test::expect_bad_input([&] { read_pt(d / "legacy.pt"); },
                         {"legacy.pt", "legacy torch.save format", "re-save it with torch.save(obj, path)"});
  test::expect_bad_input([&] { read_pt(d / "missing.pt"); }, {"missing.pt"});
}

TEST(PtRefuses, CraftedPicklesFailPrecisely) {
  // Each file: a zip holding archive/data.pkl (the bytes below) and a 16-byte archive/data/0.
  test::TempDir d;
  const std::string folder = "D = '" + d.path() + "/'\n";
  test::run_python(
      folder +
      "import struct, zipfile\n"
      "def s(x): b = x.encode(); return b'X' + struct.pack('<I', len(b)) + b\n"
      "def i(n): return b'J' + struct.pack('<i', n)\n"
      "def g(m, n): return b'c' + m.encode() + b'\\n' + n.encode() + b'\\n'\n"
      "def storage(key, numel, cls='FloatStorage'):\n"
      "    return b'(' + s('storage') + g('torch', cls) + s(key) + s('cpu') + i(numel) + b'tQ'\n"
      "def tensor(st, off, size, stride):\n"
      "    return (g('torch._utils', '_rebuild_tensor_v2') + b'(' + st + i(off) + b'(' + b''.join(map(i, size)) +\n"
      "            b't(' + b''.join(map(i, stride)) + b't\\x89}tR')\n"
      "def sd(*items): return b'\\x80\\x02}(' + b''.join(s(k) + v for k, v in items) + b'u.'\n"
      "def save(name, pkl, members={'archive/data/0': b'\\0' * 16}):\n"
      "    with zipfile.ZipFile(D + name, 'w') as z:\n"
      "        if pkl is not None: z.writestr('archive/data.pkl', pkl)\n"
      "        for k, v in members.items(): z.writestr(k, v)\n"
      "T = tensor(storage('0', 4), 1, [3], [1])\n"
      "save('ok', sd(('w', T), ('n', b'K\\x07')))\n"
      "save('extent', sd(('w', tensor(storage('0', 4), 0, [3], [2]))))\n"
      "save('small', sd(('w', tensor(storage('0', 8), 0, [8], [1]))))\n"
      "save('member', sd(('w', tensor(storage('9', 4), 0, [4], [1]))))\n"
      "save('stride', sd(('w', tensor(storage('0', 4), 0, [2], [-1]))))\n"
      "save('dup', sd(('w', T), ('w', T)))\n"
      "save('cycle', b'\\x80\\x02]q\\x00h\\x00a.')\n"
      "save('deep', b'\\x80\\x02]q\\x00' + b']h\\x00aq\\x00' * 1100 + b'.')\n"
      "save('blowup', b'\\x80\\x02](NNeq\\x00' + b'](h\\x00h\\x00eq\\x00' * 60 + b'.')\n"
      "save('opcode', b'\\x80\\x02\\xff')\n"
      "save('inst', b'\\x80\\x02(i__builtin__\\nobject\\n.')\n"
      "save('memo', b'\\x80\\x02h\\x05.')\n"
      "save('memo_huge', b'\\x80\\x02Nr\\xff\\xff\\xff\\xff.')\n"
      "save('long', b'\\x80\\x02\\x8a\\x09' + b'\\x01' * 9 + b'.')\n"
      "save('key', b'\\x80\\x02})K\\x01s.')\n"
      "save('stack_global', b'\\x80\\x04\\x8c\\x08builtins\\x8c\\x04eval\\x93.')\n"
      "save('length', b'\\x80\\x02X\\xff\\x00\\x00\\x00ab')\n"
      "save('no_stop', b'\\x80\\x02N')\n"
      "save('underflow', b'\\x80\\x02s.')\n"
      "save('build', b'\\x80\\x02]}b.')\n"
      "save('utf8', b'\\x80\\x02X\\x02\\x00\\x00\\x00\\xc3\\x28.')\n"
      "save('dims', sd(('w', tensor(storage('0', 4), 0, [1] * 65, [1] * 65))))\n"
      "save('size_list', sd(('w', g('torch._utils', '_rebuild_tensor_v2') + b'(' + storage('0', 4) + i(0) +\n"
      "                            b']K\\x02a(K\\x01t\\x89}tR')))\n"
      "save('proto', b'\\x80\\x09.')\n"
      "save('call_storage', b'\\x80\\x02ctorch\\nFloatStorage\\n)R.')\n"
      "save('no_pkl', None, {'notes.txt': b'hi'})\n"
      "save('byteorder', sd(('w', T)), {'archive/data/0': b'\\0' * 16, 'archive/byteorder': b'middle'})\n");
  const PtContents ok = read_pt(d / "ok");  // the helpers above build a valid file
  ASSERT_EQ(ok.tensors.size(), 1u);
  EXPECT_EQ(ok.tensors[0].array.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(ok.skipped, (std::vector<std::string>{"n: int 7"}));

  const struct {
    const char* file;
    std::initializer_list<const char*> needles;
  } kCases[] = {
      {"extent",
       {"archive/data.pkl byte", "size [3], stride [2], offset 0 reaches past the 4 elements of storage '0'"}},
      {"small", {"declares 8 float32 elements (32 bytes), but zip member 'archive/data/0' holds 16 bytes"}},
      {"member", {"storage '9' has no zip member 'archive/data/9'"}},
      {"stride", {"the tensor stride holds -1"}},
      {"dup", {"'w': two tensors flatten to this name"}},
      {"cycle", {"a list that contains itself"}},
      {"deep", {"nested deeper than 1000 levels"}},
      {"blowup", {"containers referenced many times"}},
      {"opcode", {"archive/data.pkl byte 2: unknown pickle opcode 0xff"}},
      {"inst", {"byte 3: unsupported pickle opcode INST"}},
      {"memo", {"memo index 5 was never set"}},
      {"memo_huge", {"memo index 4294967295 is beyond"}},
      {"long", {"an integer of 9 bytes"}},
      {"key", {"a dict key that is a tuple"}},
      {"stack_global", {"refused global 'builtins.eval' at pickle byte 18"}},
      {"length", {"a length of 255 bytes, but only 2 bytes of pickle remain"}},
      {"no_stop", {"without STOP"}},
      {"underflow", {"empty stack"}},
      {"build", {"BUILD sets the state of a list"}},
      {"utf8", {"not valid UTF-8"}},
      {"dims", {"the tensor size has 65 dimensions; at most 64 are supported"}},
      {"size_list", {"the tensor size must be a tuple of ints, found a list"}},
      {"proto", {"pickle protocol 9; expected 2 to 5"}},
      {"call_storage", {"torch.FloatStorage is only accepted inside a storage's persistent id"}},
      {"no_pkl", {"without a '<name>/data.pkl' member", "'notes.txt'"}},
      {"byteorder", {"expected 'little' or 'big', found 'middle'"}},
  };
  for (const auto& k : kCases) {
    SCOPED_TRACE(k.file);
    const std::string path = d / k.file;
    test::expect_bad_input([&] { read_pt(path); }, {path.c_str()});
    test::expect_bad_input([&] { read_pt(d / k.file); }, k.needles);
  }
}

}  // namespace
}  // namespace crucible::io
