// data.dataset = "arrays": ArraySource over .npy / .npz / .safetensors files written by NumPy
// (the oracle): the samples and labels are the arrays' (every format, every float dtype), the
// features stay in the file's mapping (D13, checked against /proc/self/maps), the D4 report
// states the values, and bad files are bad_input naming the file.
// To add a case: write the arrays with write_arrays() (Python), open them with
// load_array_source, and compare with what Python printed.
#include "crucible/data/formats/array_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crucible/core/error.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/samplers/sampler.h"
#include "test_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;

// Python preamble: numpy, and save_st(path, {name: array}) writing a safetensors file by hand
// (Debian has no safetensors package; the format is 8 bytes of length, JSON, the data).
std::string preamble(const test::TempDir& d) {
  return "import json, struct, numpy as np\n"
         "d = '" + d.path() + "/'\n"
         "def save_st(path, arrays):\n"
         "    names = {'uint8': 'U8', 'int64': 'I64', 'int32': 'I32', 'float32': 'F32', 'float16': 'F16',"
         " 'float64': 'F64'}\n"
         "    h, off, bufs = {}, 0, []\n"
         "    for k, a in arrays.items():\n"
         "        b = np.ascontiguousarray(a).tobytes()\n"
         "        h[k] = {'dtype': names[a.dtype.name], 'shape': list(a.shape), 'data_offsets': [off, off + len(b)]}\n"
         "        off += len(b); bufs.append(b)\n"
         "    hb = json.dumps(h).encode(); hb += b' ' * ((8 - len(hb) % 8) % 8)\n"
         "    open(path, 'wb').write(struct.pack('<Q', len(hb)) + hb + b''.join(bufs))\n";
}

std::vector<uint8_t> unhex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Lines of Python output: "hex-of-features-bytes\nlabel label ...\n".
struct Expected {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> labels;
};
Expected parse_expected(const std::string& out) {
  std::istringstream in(out);
  std::string hex, labels;
  std::getline(in, hex);
  std::getline(in, labels);
  Expected e;
  e.bytes = unhex(hex);
  std::istringstream ls(labels);
  for (int64_t v; ls >> v;) e.labels.push_back(v);
  return e;
}

void expect_samples(const Source& s, const Expected& e, const std::string& what) {
  ASSERT_EQ(s.size(), static_cast<int64_t>(e.labels.size())) << what;
  const size_t bytes = static_cast<size_t>(s.spec().bytes());
  ASSERT_EQ(bytes * e.labels.size(), e.bytes.size()) << what;
  std::vector<uint8_t> got(bytes);
  for (int64_t i = 0; i < s.size(); ++i) {
    s.copy_sample(i, got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), e.bytes.data() + i * bytes, bytes)) << what << " sample " << i;
    EXPECT_EQ(s.label(i), e.labels[static_cast<size_t>(i)]) << what << " sample " << i;
  }
}

TEST(ArraySource, Uint8ImagesFromNpyNpzSafetensorsAreTheArrays) {
  test::TempDir d;
  const Expected e = parse_expected(test::run_python(
      preamble(d) +
      "rng = np.random.default_rng(3)\n"
      "x = rng.integers(0, 256, (7, 4, 6), dtype=np.uint8)\n"
      "y = rng.integers(0, 5, 7).astype(np.int64); y[2] = 4\n"
      "np.save(d + 'x.npy', x); np.save(d + 'y.npy', y)\n"
      "np.savez(d + 'xy.npz', x=x, y=y.astype(np.int32))\n"
      "save_st(d + 'xy.safetensors', {'images': x, 'labels': y})\n"
      "print(x.tobytes().hex()); print(' '.join(str(v) for v in y))\n"));
  for (auto [xs, ys] : std::vector<std::pair<std::string, std::string>>{
           {"x.npy", "y.npy"}, {"xy.npz:x", "xy.npz:y"}, {"xy.safetensors:images", "xy.safetensors:labels"},
           {"xy.npz:x.npy", "y.npy"}}) {
    auto s = load_array_source(d / xs, d / ys);
    const ImageSpec spec = s->spec();
    EXPECT_EQ(spec.height, 4);
    EXPECT_EQ(spec.width, 6);
    EXPECT_EQ(spec.channels, 1);
    EXPECT_EQ(spec.type, SampleType::kPixels);
    EXPECT_EQ(spec.range, ValueRange::kByte);
    EXPECT_EQ(spec.order, ColorOrder::kGray);
    EXPECT_EQ(s->num_classes(), 5);
    expect_samples(*s, e, xs);
  }
  // data.train_samples: the first n.
  auto s = load_array_source(d / "x.npy", d / "y.npy", 3, "data.train_samples");
  EXPECT_EQ(s->size(), 3);
  EXPECT_EQ(0, std::memcmp(s->pixels(2), e.bytes.data() + 2 * 24, 24));
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "y.npy", 8, "data.train_samples"); },
                         {"data.train_samples = 8", "holds 7 samples"});
}

TEST(ArraySource, ChannelsLastRgbAndTheArrayPipelineFlip) {
  test::TempDir d;
  const Expected e = parse_expected(test::run_python(
      preamble(d) +
      "x = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)\n"
      "np.save(d + 'x.npy', x); np.save(d + 'y.npy', np.array([1, 0], np.uint8))\n"
      "np.save(d + 'flipped.npy', x[:, :, ::-1, :].copy())\n"
      "print(x.tobytes().hex()); print('1 0')\n"));
  auto s = std::shared_ptr<const ArraySource>(load_array_source(d / "x.npy", d / "y.npy"));
  EXPECT_EQ(s->spec().channels, 3);
  EXPECT_EQ(s->spec().order, ColorOrder::kRGB);
  expect_samples(*s, e, "rgb");
  // hflip = 1 flips every training sample, as for IDX images.
  const std::string flipped = test::run_python("import numpy as np\nprint(np.load('" + (d / "flipped.npy") +
                                               "').tobytes().hex())\n");
  ArrayPipeline p(s, test::flip(1.0f), 7);
  std::vector<uint8_t> dst(36);
  EXPECT_EQ(p.produce(1, 0, dst.data()), 0);
  const std::vector<uint8_t> want = unhex(flipped);
  ASSERT_EQ(want.size(), 72u);
  EXPECT_EQ(dst, std::vector<uint8_t>(want.begin() + 36, want.end()));
}

TEST(ArraySource, FloatFeaturesAreFloat32AsStored) {
  test::TempDir d;
  // float16 / bfloat16-representable / float64 values equal to the float32 ones convert exactly.
  const Expected e = parse_expected(test::run_python(
      preamble(d) +
      "x = (np.arange(4 * 2 * 3 * 5, dtype=np.float32).reshape(4, 2, 3, 5) - 50) / 8\n"
      "y = np.array([0, 1, 2, 1], np.int64)\n"
      "np.save(d + 'f32.npy', x); np.save(d + 'f16.npy', x.astype(np.float16))\n"
      "np.save(d + 'f64.npy', x.astype(np.float64)); np.save(d + 'y.npy', y)\n"
      "bf = (x.view(np.uint32) >> 16).astype(np.uint16)\n"
      "save_st(d + 'x.safetensors', {'x': x})\n"
      "h = json.dumps({'x': {'dtype': 'BF16', 'shape': list(x.shape), 'data_offsets': [0, bf.nbytes]}}).encode()\n"
      "h += b' ' * ((8 - len(h) % 8) % 8)\n"
      "open(d + 'bf16.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + bf.tobytes())\n"
      "v = x.reshape(4, 30); np.save(d + 'vec.npy', v)\n"
      "print(x.tobytes().hex()); print(' '.join(str(v) for v in y))\n"));
  for (const char* f : {"f32.npy", "f16.npy", "f64.npy", "x.safetensors", "bf16.safetensors", "vec.npy"}) {
    auto s = load_array_source(d / f, d / "y.npy");
    const ImageSpec spec = s->spec();
    EXPECT_EQ(spec.type, SampleType::kFeatures) << f;
    EXPECT_EQ(spec.bytes(), 30 * 4) << f;
    if (std::string(f) == "vec.npy") {
      EXPECT_EQ(spec.channels, 30);
      EXPECT_EQ(spec.height, 1);
    } else {
      EXPECT_EQ(spec.channels, 2) << f;
      EXPECT_EQ(spec.height, 3) << f;
      EXPECT_EQ(spec.width, 5) << f;
    }
    expect_samples(*s, e, f);
    // Float features are never flipped: ArrayPipeline copies them as they are.
    auto shared = std::shared_ptr<const ArraySource>(std::move(s));
    ArrayPipeline p(shared, test::flip(0.0f), 1);
    std::vector<uint8_t> dst(120);
    p.produce(3, 0, dst.data());
    EXPECT_EQ(0, std::memcmp(dst.data(), e.bytes.data() + 3 * 120, 120)) << f;
  }
}

// The address ranges /proc/self/maps shows for `path` (the kernel's view: a copy in RAM is not there).
std::vector<std::pair<uintptr_t, uintptr_t>> mappings_of(const std::string& path) {
  const std::string want = fs::canonical(path).string();
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos || line.substr(slash) != want) continue;
    uintptr_t lo = 0, hi = 0;
    std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi);
    out.emplace_back(lo, hi);
  }
  return out;
}

bool in_mapping(const void* p, size_t n, const std::string& path) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [lo, hi] : mappings_of(path)) {
    if (a >= lo && a + n <= hi) return true;
  }
  return false;
}

TEST(ArraySource, FeaturesStayInTheFileMappingD13) {
  test::TempDir d;
  // 2000 images of 64x64 (8 MB): a copy would live on the heap, not in the file's mapping.
  test::run_python(preamble(d) +
                   "x = np.random.default_rng(0).integers(0, 256, (2000, 64, 64), dtype=np.uint8)\n"
                   "y = np.arange(2000) % 10\n"
                   "np.save(d + 'x.npy', x); np.save(d + 'y.npy', y)\n"
                   "np.savez(d + 'stored.npz', x=x, y=y)\n"
                   "np.savez_compressed(d + 'deflated.npz', x=x, y=y)\n"
                   "save_st(d + 'x.safetensors', {'y': y, 'x': x})\n");
  for (auto [ref, file] : std::vector<std::pair<std::string, std::string>>{
           {"x.npy", "x.npy"}, {"stored.npz:x", "stored.npz"}, {"x.safetensors:x", "x.safetensors"}}) {
    auto s = load_array_source(d / ref, d / "y.npy");
    EXPECT_TRUE(s->features_mapped()) << ref << ": " << s->features_note();
    // The kernel's view: the first and the last sample's bytes lie in the file's mapping.
    EXPECT_TRUE(in_mapping(s->pixels(0), 4096, d / file)) << ref;
    EXPECT_TRUE(in_mapping(s->pixels(1999), 4096, d / file)) << ref;
    test::expect_contains(s->describe(), "memory-mapped");
  }
  // A deflated member cannot be viewed: it is inflated, and the source says so and how to avoid it.
  auto s = load_array_source(d / "deflated.npz:x", d / "y.npy");
  EXPECT_FALSE(s->features_mapped());
  test::expect_contains(s->features_note(), "np.savez");
  EXPECT_FALSE(in_mapping(s->pixels(0), 4096, d / "deflated.npz"));
}

TEST(ArraySource, ValueReportStatesTheRangeAndWarnsOfUnnormalisedFloatsD4) {
  test::TempDir d;
  test::run_python(preamble(d) +
                   "rng = np.random.default_rng(1)\n"
                   "np.save(d + 'u8.npy', rng.integers(3, 200, (50, 4, 4), dtype=np.uint8))\n"
                   "np.save(d + 'byte.npy', rng.integers(0, 256, (50, 1, 4, 4)).astype(np.float32))\n"
                   "np.save(d + 'big.npy', rng.normal(0, 40, (50, 16)).astype(np.float32))\n"
                   "ok = rng.normal(0, 1, (50, 1, 4, 4)).astype(np.float32); np.save(d + 'ok.npy', ok)\n"
                   "ok[3, 0, 1, 1] = np.nan; np.save(d + 'nan.npy', ok)\n"
                   "np.save(d + 'y.npy', np.zeros(50, np.int64))\n");
  auto r = load_array_source(d / "u8.npy", d / "y.npy")->value_report(10);
  test::expect_contains(r.info, "uint8 [50, 4, 4]");
  test::expect_contains(r.info, "first 10 samples");
  test::expect_contains(r.info, "data.mean");
  EXPECT_EQ(r.warning, "");
  r = load_array_source(d / "byte.npy", d / "y.npy")->value_report();
  test::expect_contains(r.info, "float32 [50, 1, 4, 4]");
  test::expect_contains(r.info, "used as they are");
  test::expect_contains(r.warning, "un-normalised");
  test::expect_contains(r.warning, "0-255");
  test::expect_contains(r.warning, d / "byte.npy");
  r = load_array_source(d / "big.npy", d / "y.npy")->value_report();
  test::expect_contains(r.warning, "un-normalised");
  r = load_array_source(d / "ok.npy", d / "y.npy")->value_report();
  EXPECT_EQ(r.warning, "") << r.warning;
  test::expect_contains(r.info, "min -");
  r = load_array_source(d / "nan.npy", d / "y.npy")->value_report();
  test::expect_contains(r.warning, "NaN");
}

TEST(ArraySource, BadFilesAreBadInputNamingTheFile) {
  test::TempDir d;
  test::run_python(preamble(d) +
                   "x = np.zeros((5, 4, 4), np.uint8)\n"
                   "np.save(d + 'x.npy', x); np.save(d + 'y4.npy', np.arange(4))\n"
                   "np.save(d + 'yneg.npy', np.array([0, 1, 2, -1, 0], np.int16))\n"
                   "np.save(d + 'yf.npy', np.zeros(5, np.float32))\n"
                   "np.save(d + 'y3d.npy', np.zeros((5, 1, 1), np.int64))\n"
                   "np.save(d + 'y.npy', np.zeros(5, np.int64))\n"
                   "np.save(d + 'xi32.npy', np.zeros((5, 4, 4), np.int32))\n"
                   "np.save(d + 'xchw.npy', np.zeros((5, 3, 4, 4), np.uint8))\n"
                   "np.savez(d + 'two.npz', a=x, b=x)\n"
                   "save_st(d + 'two.safetensors', {'p': x, 'q': x})\n"
                   "open(d + 'text.csv', 'w').write('1,2\\n3,4\\n')\n");
  // Counts differ: both files, both counts.
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "y4.npy"); },
                         {"x.npy holds 5 samples", "y4.npy holds 4 labels"});
  // A negative label: the file and the index.
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "yneg.npy"); },
                         {"yneg.npy", "label -1 at index 3", "negative"});
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "yf.npy"); }, {"yf.npy", "integer", "float32"});
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "y3d.npy"); }, {"y3d.npy", "[5, 1, 1]"});
  // Features of a dtype crucible does not take: the file and the dtype.
  test::expect_bad_input([&] { load_array_source(d / "xi32.npy", d / "y.npy"); }, {"xi32.npy", "int32", "uint8"});
  test::expect_bad_input([&] { load_array_source(d / "xchw.npy", d / "y.npy"); }, {"xchw.npy", "channels-first"});
  // Several arrays and no name: the file and its names; a wrong name likewise.
  test::expect_bad_input([&] { load_array_source(d / "two.npz", d / "y.npy"); },
                         {"two.npz holds 2 arrays", "a, b", "two.npz:NAME"});
  test::expect_bad_input([&] { load_array_source(d / "two.safetensors", d / "y.npy"); },
                         {"two.safetensors holds 2 arrays", "p, q"});
  test::expect_bad_input([&] { load_array_source(d / "two.npz:c", d / "y.npy"); },
                         {"two.npz", "no array named 'c'", "a, b"});
  test::expect_bad_input([&] { load_array_source(d / "x.npy:x", d / "y.npy"); }, {"x.npy", "one array"});
  test::expect_bad_input([&] { load_array_source(d / "text.csv", d / "y.npy"); }, {"text.csv", ".npy, .npz"});
  test::expect_bad_input([&] { load_array_source(d / "missing.npz:x", d / "y.npy"); }, {"missing.npz"});
}

// Multi-label targets [n, classes] (loss.name = "binary_cross_entropy"): bool, 0/1 integers or
// floats within 0–1, as NumPy wrote them; label() is -1; the loader's batches carry each sample's
// row (by sample id, through a shuffled 2-thread loader); a value outside the rule names the
// file, sample and class.
TEST(ArraySource, MultiLabelTargetsAreTheArrayRowsInEveryBatch) {
  test::TempDir d;
  const std::string rows = test::run_python(
      preamble(d) +
      "rng = np.random.default_rng(3)\n"
      "x = rng.integers(0, 255, (11, 2, 2), dtype=np.uint8)\n"
      "t = rng.random((11, 3)) < 0.4\n"
      "np.save(d + 'x.npy', x); np.save(d + 'tb.npy', t); np.save(d + 'tu.npy', t.astype(np.uint8))\n"
      "soft = (t * 0.75 + 0.125).astype(np.float64); np.save(d + 'tsoft.npy', soft)\n"
      "save_st(d + 't.safetensors', {'t': t.astype(np.float32)})\n"
      "bad = t.astype(np.uint8); bad[4, 2] = 2; np.save(d + 'tbad.npy', bad)\n"
      "fbad = t.astype(np.float32); fbad[6, 1] = 1.5; np.save(d + 'tfbad.npy', fbad)\n"
      "fnan = t.astype(np.float32); fnan[2, 0] = np.nan; np.save(d + 'tnan.npy', fnan)\n"
      "print(' '.join(str(int(v)) for v in t.ravel()))\n");
  std::vector<float> want;
  std::istringstream in(rows);
  for (int v; in >> v;) want.push_back(static_cast<float>(v));
  ASSERT_EQ(want.size(), 33u);
  for (const std::string file : {"tb.npy", "tu.npy", "t.safetensors"}) {
    auto s = std::shared_ptr<const ArraySource>(load_array_source(d / "x.npy", d / file));
    ASSERT_EQ(s->target_width(), 3) << file;
    EXPECT_EQ(s->num_classes(), 3) << file;
    for (int64_t i = 0; i < s->size(); ++i) {
      EXPECT_EQ(s->label(i), -1) << file;
      EXPECT_EQ(std::vector<float>(s->targets(i), s->targets(i) + 3),
                std::vector<float>(want.begin() + 3 * i, want.begin() + 3 * i + 3))
          << file << " sample " << i;
    }
  }
  auto soft = std::shared_ptr<const ArraySource>(load_array_source(d / "x.npy", d / "tsoft.npy"));
  EXPECT_FLOAT_EQ(soft->targets(0)[0], want[0] * 0.75f + 0.125f);
  // Through the loader: every batch row is its sample's targets.
  auto s = std::shared_ptr<const ArraySource>(load_array_source(d / "x.npy", d / "tu.npy"));
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.threads = 2;
  Loader loader(std::make_shared<ArrayPipeline>(s, test::flip(0.5f), 1), DistributedSampler(11, true, 5, {1, 0, false}), lo);
  loader.start_epoch(1);
  int64_t seen = 0;
  while (auto b = loader.next()) {
    ASSERT_EQ(b->target_width, 3);
    ASSERT_EQ(b->targets.size(), b->sample_ids.size() * 3);
    for (size_t r = 0; r < b->sample_ids.size(); ++r, ++seen) {
      const int64_t id = b->sample_ids[r];
      EXPECT_EQ(std::vector<float>(b->targets.begin() + 3 * r, b->targets.begin() + 3 * r + 3),
                std::vector<float>(want.begin() + 3 * id, want.begin() + 3 * id + 3))
          << "batch " << b->index << " row " << r;
    }
  }
  EXPECT_EQ(seen, 11);
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "tbad.npy"); },
                         {"tbad.npy", "sample 4 class 2 is 2", "0 or 1"});
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "tfbad.npy"); },
                         {"tfbad.npy", "sample 6 class 1 is 1.5", "within 0"});
  test::expect_bad_input([&] { load_array_source(d / "x.npy", d / "tnan.npy"); }, {"tnan.npy", "sample 2 class 0"});
}

TEST(ArraySource, ArrayRefSplitsNameOnlyWhenTheWholeIsNoFile) {
  test::TempDir d;
  test::write_text(d / "a:b.npy", "x");
  EXPECT_EQ(parse_array_ref(d / "a:b.npy").path, d / "a:b.npy");  // a colon in a file name
  EXPECT_EQ(parse_array_ref(d / "a:b.npy").name, "");
  test::write_text(d / "f.npz", "x");
  EXPECT_EQ(parse_array_ref(d / "f.npz:x").path, d / "f.npz");
  EXPECT_EQ(parse_array_ref(d / "f.npz:x").name, "x");
  EXPECT_EQ(parse_array_ref("plain.npy").name, "");
}

}  // namespace
}  // namespace crucible::data
