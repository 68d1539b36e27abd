// Decoder tests (D2, D3, D5): PIL (Debian's python3-pil, itself on libjpeg-turbo) is the oracle
// for whole images, orientation and colour conversion; region and DCT-scaled decodes are checked
// against the full decode. To add a case: write the file from Python with kPrelude's helpers
// (pattern(), dump() writes PIL's RGB pixels to <path>.rgb), then compare with expect_close().
#include "crucible/data/image/decode.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace crucible::data {
namespace {

// Python helpers shared by the oracle scripts.
const char* const kPrelude = R"PY(
import struct, sys, zlib
import numpy as np
from PIL import Image, ImageOps

def pattern(w, h, seed=0, noise=5.0):
    """A smooth, asymmetric RGB test picture with a little noise (texture for the DCT)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 90 * np.sin(x / 9.0 + y / 23.0)
    g = 128 + 90 * np.cos(y / 7.0 - x / 31.0)
    b = 200 * x / max(w - 1, 1) * 0.6 + 200 * y / max(h - 1, 1) * 0.4
    a = np.stack([r, g, b], -1) + rng.normal(0, noise, (h, w, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), 'RGB')

def dump(img, path):
    """PIL's RGB pixels of img, raw, to path."""
    open(path, 'wb').write(np.asarray(img.convert('RGB'), dtype=np.uint8).tobytes())

def write_png(path, a, color_type, bit_depth, interlace=False):
    """A PNG written by hand (PIL cannot write 16-bit RGB or Adam7): a is [h, w, c]."""
    h, w = a.shape[:2]
    a = a.reshape(h, w, -1)
    s = a.astype('>u2') if bit_depth == 16 else a.astype(np.uint8)
    rows = lambda sub: b''.join(b'\x00' + sub[i].tobytes() for i in range(sub.shape[0]))
    if interlace:
        raw = b''
        for x0, y0, dx, dy in [(0,0,8,8), (4,0,8,8), (0,4,4,8), (2,0,4,4), (0,2,2,4), (1,0,2,2), (0,1,1,2)]:
            sub = s[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += rows(sub)
    else:
        raw = rows(s)
    chunk = lambda t, d: struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    ihdr = struct.pack('>IIBBBBB', w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    open(path, 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(raw)) +
                           chunk(b'IEND', b''))

def with_exif(img, path, orientation, **kw):
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(path, exif=exif, **kw)
)PY";

std::string python(const std::string& body) {
  return test::run_python(std::string(kPrelude) + body);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string s = test::read_text(path);
  return {s.begin(), s.end()};
}

DecodedImage decode_file(const std::string& path, const DecodeOptions& options = {}) {
  const std::vector<uint8_t> b = read_bytes(path);
  return decode_image(b.data(), b.size(), path, options);
}

ImageInfo probe_file(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path);
  return probe_image(b.data(), b.size(), path);
}

int max_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(int(a[i]) - int(b[i])));
  return d;
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.empty() || a.size() != b.size()) return 1e9;
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / double(a.size());
}

// Rows and columns `r` of an RGB image `width` pixels wide.
std::vector<uint8_t> crop(const std::vector<uint8_t>& px, int width, const Rect& r) {
  std::vector<uint8_t> out;
  for (int y = r.y; y < r.y + r.height; ++y)
    out.insert(out.end(), px.begin() + (size_t(y) * width + r.x) * 3,
               px.begin() + (size_t(y) * width + r.x + r.width) * 3);
  return out;
}

// Averages f x f blocks (an image whose size is a multiple of f).
std::vector<uint8_t> box_downscale(const std::vector<uint8_t>& px, int width, int height, int f) {
  std::vector<uint8_t> out;
  for (int y = 0; y + f <= height; y += f)
    for (int x = 0; x + f <= width; x += f)
      for (int c = 0; c < 3; ++c) {
        int s = 0;
        for (int dy = 0; dy < f; ++dy)
          for (int dx = 0; dx < f; ++dx) s += px[(size_t(y + dy) * width + x + dx) * 3 + c];
        out.push_back(uint8_t((s + f * f / 2) / (f * f)));
      }
  return out;
}

// Decodes `path` whole and expects PIL's pixels (<path>.rgb) within `tolerance`.
void expect_matches_pil(const std::string& path, int width, int height, int tolerance) {
  SCOPED_TRACE(path);
  const DecodedImage img = decode_file(path);
  EXPECT_EQ(img.width, width);
  EXPECT_EQ(img.height, height);
  EXPECT_EQ(img.region.width, width);
  EXPECT_EQ(img.region.height, height);
  EXPECT_LE(max_abs_diff(img.pixels, read_bytes(path + ".rgb")), tolerance);
}

// 16-byte CRWP header + samples.
std::vector<uint8_t> raw_image(int height, int width, int channels, const std::vector<uint8_t>& samples) {
  std::vector<uint8_t> b(kRawMagic, kRawMagic + 4);
  for (uint32_t v : {uint32_t(height), uint32_t(width), uint32_t(channels)})
    for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
  b.insert(b.end(), samples.begin(), samples.end());
  return b;
}

TEST(DecodeFormat, DetectsMagicBytes) {
  const uint8_t jpeg[] = {0xFF, 0xD8, 0xFF, 0xE0};
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  const uint8_t raw[] = {'C', 'R', 'W', 'P'};
  const uint8_t other[] = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  EXPECT_EQ(detect_encoding(jpeg, sizeof jpeg), Encoding::kJpeg);
  EXPECT_EQ(detect_encoding(png, sizeof png), Encoding::kPng);
  EXPECT_EQ(detect_encoding(png, 7), Encoding::kUnknown);
  EXPECT_EQ(detect_encoding(raw, sizeof raw), Encoding::kRaw);
  EXPECT_EQ(detect_encoding(other, sizeof other), Encoding::kUnknown);
  EXPECT_EQ(detect_encoding(nullptr, 0), Encoding::kUnknown);
  EXPECT_STREQ(encoding_name(Encoding::kJpeg), "jpeg");
  EXPECT_STREQ(encoding_name(Encoding::kPng), "png");
  EXPECT_STREQ(encoding_name(Encoding::kRaw), "raw");
  EXPECT_STREQ(encoding_name(Encoding::kUnknown), "unknown");
}

TEST(DecodeJpeg, FullDecodeMatchesPil) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(97, 61)\n"
         "img.save(d + '/444.jpg', quality=95, subsampling=0)\n"
         "img.save(d + '/420.jpg', quality=90, subsampling=2)\n"
         "img.save(d + '/422.jpg', quality=90, subsampling=1)\n"
         "img.save(d + '/prog.jpg', quality=90, progressive=True)\n"
         "for n in ['444', '420', '422', 'prog']:\n"
         "    dump(Image.open(d + '/' + n + '.jpg'), d + '/' + n + '.jpg.rgb')\n");
  for (const char* n : {"444", "420", "422", "prog"}) {
    const std::string path = dir / (std::string(n) + ".jpg");
    const ImageInfo info = probe_file(path);
    EXPECT_EQ(info.encoding, Encoding::kJpeg);
    EXPECT_EQ(info.width, 97);
    EXPECT_EQ(info.height, 61);
    EXPECT_EQ(info.channels, 3);
    EXPECT_EQ(info.orientation, 1);
    expect_matches_pil(path, 97, 61, 2);
  }
}

TEST(DecodePng, MatchesPilForEveryColorType) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(45, 31, noise=40)\n"
         "a = np.asarray(img)\n"
         "def save(im, name):\n"
         "    im.save(d + '/' + name)\n"
         "    dump(Image.open(d + '/' + name), d + '/' + name + '.rgb')\n"
         "save(img, 'rgb.png')\n"
         "rgba = img.copy(); rgba.putalpha(Image.fromarray((a[..., 0] // 2).astype(np.uint8)))\n"
         "save(rgba, 'rgba.png')\n"
         "save(img.convert('L'), 'gray.png')\n"
         "save(img.convert('LA'), 'gray_alpha.png')\n"
         "save(img.convert('1'), 'bilevel.png')\n"
         "save(img.convert('P', palette=Image.ADAPTIVE, colors=37), 'palette.png')\n"
         "pt = img.convert('P', palette=Image.ADAPTIVE, colors=16); pt.info['transparency'] = 3\n"
         "save(pt, 'palette_trns.png')\n"
         // 16-bit: the oracle is the high byte (what 8-bit output keeps; PIL clips 16-bit gray).
         "rng = np.random.default_rng(1)\n"
         "a16 = rng.integers(0, 65536, (31, 45, 3), dtype=np.uint16)\n"
         "write_png(d + '/rgb16.png', a16, 2, 16)\n"
         "open(d + '/rgb16.png.rgb', 'wb').write((a16 >> 8).astype(np.uint8).tobytes())\n"
         "g16 = a16[..., :1]\n"
         "write_png(d + '/gray16.png', g16, 0, 16)\n"
         "open(d + '/gray16.png.rgb', 'wb').write(np.repeat(g16 >> 8, 3, -1).astype(np.uint8).tobytes())\n"
         "write_png(d + '/interlaced.png', a, 2, 8, interlace=True)\n"
         "dump(Image.open(d + '/interlaced.png'), d + '/interlaced.png.rgb')\n"
         "write_png(d + '/rgba16_interlaced.png', np.concatenate([a16, a16[..., :1]], -1), 6, 16, interlace=True)\n"
         "open(d + '/rgba16_interlaced.png.rgb', 'wb').write((a16 >> 8).astype(np.uint8).tobytes())\n");
  const std::pair<const char*, int> cases[] = {
      {"rgb", 3},          {"rgba", 4},  {"gray", 1},   {"gray_alpha", 2}, {"bilevel", 1},          {"palette", 3},
      {"palette_trns", 3}, {"rgb16", 3}, {"gray16", 1}, {"interlaced", 3}, {"rgba16_interlaced", 4}};
  for (const auto& [n, channels] : cases) {
    const std::string path = dir / (std::string(n) + ".png");
    const ImageInfo info = probe_file(path);
    EXPECT_EQ(info.encoding, Encoding::kPng) << n;
    EXPECT_EQ(info.width, 45) << n;
    EXPECT_EQ(info.height, 31) << n;
    EXPECT_EQ(info.channels, channels) << n;
    expect_matches_pil(path, 45, 31, 0);
  }
  // Regions: the row-by-row path (non-interlaced) and the whole-image path (Adam7).
  for (const char* n : {"rgb", "palette", "interlaced"}) {
    const std::string path = dir / (std::string(n) + ".png");
    const std::vector<uint8_t> full = read_bytes(path + ".rgb");
    for (const Rect& r : {Rect{0, 0, 1, 1}, Rect{44, 30, 1, 1}, Rect{3, 5, 20, 11}, Rect{30, 20, 15, 11}}) {
      DecodeOptions o;
      o.region = r;
      o.min_width = 2;  // ignored: PNG is never scaled
      const DecodedImage img = decode_file(path, o);
      EXPECT_EQ(img.width, r.width);
      EXPECT_EQ(img.height, r.height);
      EXPECT_EQ(img.pixels, crop(full, 45, r)) << n << " " << r.x << "," << r.y;
    }
  }
}

// The pixels of `img` as [height, width, 3], whether padded (DecodeOptions::padded_rows) or not.
std::vector<uint8_t> rows_of(const DecodedImage& img) {
  std::vector<uint8_t> out;
  const size_t row = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* r = img.data() + static_cast<size_t>(y) * img.stride();
    out.insert(out.end(), r, r + row);
  }
  return out;
}

TEST(DecodeJpeg, RegionEqualsCropOfFullDecode) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(203, 157)\n"
         "img.save(d + '/444.jpg', quality=95, subsampling=0)\n"
         "img.save(d + '/420.jpg', quality=90, subsampling=2)\n"
         "img.save(d + '/prog.jpg', quality=90, progressive=True)\n"
         "img.convert('L').save(d + '/gray.jpg', quality=90)\n");
  const Rect regions[] = {{0, 0, 203, 157},   {0, 0, 1, 1},      {202, 156, 1, 1}, {17, 9, 50, 33},
                          {150, 100, 53, 57}, {64, 32, 16, 16},  {1, 1, 201, 155}, {100, 0, 103, 1},
                          {0, 150, 203, 7},   {191, 0, 12, 157}, {16, 16, 1, 141}};
  for (const char* n : {"444", "420", "prog", "gray"}) {
    const std::string path = dir / (std::string(n) + ".jpg");
    const DecodedImage full = decode_file(path);
    for (const Rect& r : regions) {
      DecodeOptions o;
      o.region = r;
      const DecodedImage img = decode_file(path, o);
      SCOPED_TRACE(std::string(n) + " region " + std::to_string(r.x) + "," + std::to_string(r.y) + " " +
                   std::to_string(r.width) + "x" + std::to_string(r.height));
      EXPECT_EQ(img.width, r.width);
      EXPECT_EQ(img.height, r.height);
      EXPECT_EQ(img.region.x, r.x);
      EXPECT_EQ(img.region.width, r.width);
      // Fancy upsampling would differ at a crop edge; the decoder crops with one iMCU of margin
      // on each side, which makes a region exactly the full decode's pixels.
      EXPECT_EQ(max_abs_diff(img.pixels, crop(full.pixels, 203, r)), 0);
      // Decoded in place (libjpeg's cropped columns kept beside the region): the same pixels.
      o.padded_rows = true;
      const DecodedImage padded = decode_file(path, o);
      EXPECT_EQ(padded.width, r.width);
      EXPECT_GE(padded.stride(), static_cast<size_t>(r.width) * 3);
      EXPECT_EQ(max_abs_diff(rows_of(padded), crop(full.pixels, 203, r)), 0);
      // Into recycled storage, longer than needed and full of another image's bytes: the same.
      std::vector<uint8_t> storage(203 * 157 * 3 + 999, 0xA5);
      o.recycle = &storage;
      DecodedImage recycled = decode_file(path, o);
      EXPECT_EQ(max_abs_diff(rows_of(recycled), crop(full.pixels, 203, r)), 0);
      EXPECT_GE(recycled.pixels.size(), 203u * 157 * 3 + 999) << "not the storage";
      storage.swap(recycled.pixels);
    }
  }
}

TEST(DecodeJpeg, DctScalingPicksTheSmallestScaleCoveringTheMinimum) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "pattern(320, 240, noise=2).save(d + '/a.jpg', quality=95, subsampling=0)\n"
         "pattern(320, 240, noise=2).save(d + '/b.jpg', quality=90, subsampling=2)\n");
  const std::string path = dir / "a.jpg";
  const DecodedImage full = decode_file(path);

  // Worked example: region 100x50 at (10, 6), minimum 30x10. Scales are powers of two (the
  // SIMD IDCTs): M=2 gives ceil(220/8)-floor(20/8) = 26 < 30 columns; M=4 gives
  // ceil(440/8)-floor(40/8) = 50 x ceil(224/8)-floor(24/8) = 25.
  DecodeOptions o;
  o.region = {10, 6, 100, 50};
  o.min_width = 30;
  o.min_height = 10;
  DecodedImage img = decode_file(path, o);
  EXPECT_EQ(img.width, 50);
  EXPECT_EQ(img.height, 25);
  EXPECT_EQ(img.region.width, 100);
  EXPECT_EQ(img.pixels.size(), size_t(50) * 25 * 3);

  // No minimum, or one larger than the region: full resolution.
  o.min_width = o.min_height = 0;
  EXPECT_EQ(decode_file(path, o).width, 100);
  o.min_width = 500;
  EXPECT_EQ(decode_file(path, o).width, 100);
  // A minimum on one axis only constrains that axis: 1/8 covers 5 rows.
  o.min_width = 0;
  o.min_height = 5;
  img = decode_file(path, o);
  EXPECT_EQ(img.width, 13);  // ceil(110/8) - floor(10/8)
  EXPECT_EQ(img.height, 7);  // ceil(56/8) - floor(6/8)
  // 56 rows need more than 4/8: full scale; the single column stays one.
  o.region = {1, 0, 1, 64};
  o.min_width = 0;
  o.min_height = 56;
  img = decode_file(path, o);
  EXPECT_EQ(img.width, 1);
  EXPECT_EQ(img.height, 64);
  // The whole image at 1/8 when the minimum is one pixel.
  o.region = {};
  o.min_width = o.min_height = 1;
  img = decode_file(path, o);
  EXPECT_EQ(img.width, 40);
  EXPECT_EQ(img.height, 30);
  EXPECT_EQ(img.region.width, 320);

  // Half the region as the minimum gives M = 4 (aligned regions scale exactly by 1/2) and
  // pixels close to a 2x2 box average of the full decode; 1/4 likewise with 4x4.
  for (const char* n : {"a.jpg", "b.jpg"}) {
    const DecodedImage whole = decode_file(dir / n);
    for (const Rect& r : {Rect{0, 0, 320, 240}, Rect{64, 48, 128, 96}, Rect{200, 120, 120, 120}}) {
      for (int f : {2, 4}) {
        DecodeOptions s;
        s.region = r;
        s.min_width = r.width / f;
        s.min_height = r.height / f;
        const DecodedImage scaled = decode_file(dir / n, s);
        SCOPED_TRACE(std::string(n) + " factor " + std::to_string(f) + " region at " + std::to_string(r.x));
        ASSERT_EQ(scaled.width, r.width / f);
        ASSERT_EQ(scaled.height, r.height / f);
        EXPECT_LT(mean_abs_diff(scaled.pixels, box_downscale(crop(whole.pixels, 320, r), r.width, r.height, f)), 6.0);
      }
    }
  }
  (void)full;
}

TEST(DecodeJpeg, ExifOrientationMatchesPilExifTranspose) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(64, 40)\n"
         "for o in range(1, 9):\n"
         "    p = d + '/o%d.jpg' % o\n"
         "    with_exif(img, p, o, quality=95, subsampling=0)\n"
         "    dump(ImageOps.exif_transpose(Image.open(p)), p + '.rgb')\n"
         "with_exif(img, d + '/o6_420.jpg', 6, quality=95, subsampling=2)\n"
         "dump(ImageOps.exif_transpose(Image.open(d + '/o6_420.jpg')), d + '/o6_420.jpg.rgb')\n");
  for (int o = 1; o <= 8; ++o) {
    const std::string path = dir / ("o" + std::to_string(o) + ".jpg");
    SCOPED_TRACE(path);
    const bool swap = o >= 5;
    const int w = swap ? 40 : 64, h = swap ? 64 : 40;
    const ImageInfo info = probe_file(path);
    EXPECT_EQ(info.orientation, o);
    EXPECT_EQ(info.width, w);
    EXPECT_EQ(info.height, h);
    expect_matches_pil(path, w, h, 2);

    const std::vector<uint8_t> pil = read_bytes(path + ".rgb");
    for (const Rect& r : {Rect{0, 0, 1, 1}, Rect{3, 5, 17, 9}, Rect{w - 13, h - 7, 13, 7}, Rect{0, h / 2, w, h / 2}}) {
      DecodeOptions opt;
      opt.region = r;
      const DecodedImage img = decode_file(path, opt);
      EXPECT_EQ(img.width, r.width);
      EXPECT_EQ(img.height, r.height);
      EXPECT_LE(max_abs_diff(img.pixels, crop(pil, w, r)), 2) << r.x << "," << r.y;
    }
    // Scaled, in display orientation: an even region at half size.
    DecodeOptions half;
    half.region = {4, 8, 24, 16};
    half.min_width = 12;
    half.min_height = 8;
    const DecodedImage img = decode_file(path, half);
    ASSERT_EQ(img.width, 12);
    ASSERT_EQ(img.height, 8);
    EXPECT_LT(mean_abs_diff(img.pixels, box_downscale(crop(pil, w, half.region), 24, 16, 2)), 6.0);
  }
  expect_matches_pil(dir / "o6_420.jpg", 40, 64, 2);
}

// The spec's scaled span: floor(start*m/8) to ceil(end*m/8), clamped to the scaled image and to
// `len` pixels. Returns {begin, size}.
std::pair<int, int> spec_span(int start, int len, int full, int m) {
  const int begin = start * m / 8;
  const int end = std::min({((start + len) * m + 7) / 8, (full * m + 7) / 8, begin + len});
  return {begin, end - begin};
}

TEST(DecodeJpeg, ScaledRegionEqualsCropOfScaledWholeImageInEveryOrientation) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(75, 45)\n"
         "for o in range(1, 9):\n"
         "    with_exif(img, d + '/o%d.jpg' % o, o, quality=90, subsampling=2)\n"
         "with_exif(img, d + '/p6.jpg', 6, quality=90, progressive=True)\n"
         "img.convert('CMYK').save(d + '/cmyk.jpg', quality=90)\n");
  std::vector<std::string> names;
  for (int o = 1; o <= 8; ++o) names.push_back("o" + std::to_string(o) + ".jpg");
  names.emplace_back("p6.jpg");
  names.emplace_back("cmyk.jpg");
  for (const std::string& n : names) {
    const ImageInfo info = probe_file(dir / n);
    const int w = info.width, h = info.height;
    // The whole image at each scale m/8, m a power of two (a minimum of exactly that size picks m).
    std::vector<DecodedImage> whole(9);
    for (int m : {1, 2, 4, 8}) {
      DecodeOptions o;
      o.min_width = (w * m + 7) / 8;
      o.min_height = (h * m + 7) / 8;
      whole[m] = decode_file(dir / n, o);
      ASSERT_EQ(whole[m].width, o.min_width) << n << " m=" << m;
      ASSERT_EQ(whole[m].height, o.min_height) << n << " m=" << m;
    }
    for (const Rect& r : {Rect{0, 0, w, h}, Rect{1, 2, 9, 5}, Rect{w - 20, h - 11, 20, 11}, Rect{13, 7, 31, 19},
                          Rect{0, h - 1, w, 1}, Rect{w / 2, 0, 1, h}}) {
      for (int f : {1, 2, 3, 5, 8}) {
        DecodeOptions o;
        o.region = r;
        o.min_width = std::max(1, r.width / f);
        o.min_height = std::max(1, r.height / f);
        int m = 1;
        while (m < 8 && (spec_span(r.x, r.width, w, m).second < o.min_width ||
                         spec_span(r.y, r.height, h, m).second < o.min_height))
          m *= 2;
        const auto [x0, sw] = spec_span(r.x, r.width, w, m);
        const auto [y0, sh] = spec_span(r.y, r.height, h, m);
        const DecodedImage img = decode_file(dir / n, o);
        SCOPED_TRACE(n + " m=" + std::to_string(m) + " region " + std::to_string(r.x) + "," + std::to_string(r.y) +
                     " " + std::to_string(r.width) + "x" + std::to_string(r.height));
        ASSERT_EQ(img.width, sw);
        ASSERT_EQ(img.height, sh);
        EXPECT_EQ(max_abs_diff(img.pixels, crop(whole[m].pixels, whole[m].width, Rect{x0, y0, sw, sh})), 0);
        o.padded_rows = true;  // in place where it can be (orientation 1, not CMYK), else as above
        const DecodedImage padded = decode_file(dir / n, o);
        ASSERT_EQ(padded.width, sw);
        EXPECT_EQ(max_abs_diff(rows_of(padded), crop(whole[m].pixels, whole[m].width, Rect{x0, y0, sw, sh})), 0);
      }
    }
  }
}

TEST(DecodeJpeg, ExifParsingHandlesBothByteOrdersAndJunk) {
  test::TempDir dir;
  // PIL writes big-endian ("MM") EXIF; splice hand-made APP1 segments in after SOI.
  python(
      "d = '" + dir.path() +
      "'\n"
      "pattern(40, 24).save(d + '/plain.jpg', quality=95, subsampling=0)\n"
      "j = open(d + '/plain.jpg', 'rb').read()\n"
      "def app1(payload): return b'\\xff\\xe1' + struct.pack('>H', len(payload) + 2) + payload\n"
      "le = b'Exif\\0\\0II*\\0' + struct.pack('<IH', 8, 1) + struct.pack('<HHIHH', 0x112, 3, 1, 6, 0) + b'\\0' * 4\n"
      "open(d + '/le6.jpg', 'wb').write(j[:2] + app1(le) + j[2:])\n"
      "xmp = b'http://ns.adobe.com/xap/1.0/\\0<x/>'\n"
      "open(d + '/xmp_then_exif8.jpg', 'wb').write(j[:2] + app1(xmp) + app1(le[:-8] + struct.pack('<HH', 8, 0) + "
      "b'\\0' * 4) + j[2:])\n"
      "bad = [b'Exif\\0\\0II*\\0' + struct.pack('<IH', 8, 4000),\n"    // more entries than bytes
      "       b'Exif\\0\\0MM\\0*' + struct.pack('>I', 0xfffffff0),\n"  // IFD offset past the end
      "       b'Exif\\0\\0XX*\\0' + b'\\0' * 20,\n"                    // no byte order
      "       b'Exif\\0\\0II*\\0' + struct.pack('<IH', 8, 1) + struct.pack('<HHIHH', 0x112, 3, 1, 9, 0),\n"  // value 9
      "       b'Exif\\0\\0II*\\0' + struct.pack('<IH', 8, 1) + struct.pack('<HHIH', 0x112, 3, 1, 6)]\n"  // cut entry
      "for i, p in enumerate(bad):\n"
      "    open(d + '/bad%d.jpg' % i, 'wb').write(j[:2] + app1(p) + j[2:])\n");
  ImageInfo info = probe_file(dir / "le6.jpg");
  EXPECT_EQ(info.orientation, 6);
  EXPECT_EQ(info.width, 24);
  EXPECT_EQ(info.height, 40);
  info = probe_file(dir / "xmp_then_exif8.jpg");
  EXPECT_EQ(info.orientation, 8);
  const DecodedImage plain = decode_file(dir / "plain.jpg");
  for (int i = 0; i < 5; ++i) {
    const std::string path = dir / ("bad" + std::to_string(i) + ".jpg");
    EXPECT_EQ(probe_file(path).orientation, 1) << path;
    EXPECT_EQ(decode_file(path).pixels, plain.pixels) << path;
  }
}

TEST(DecodeJpeg, CmykMatchesPil) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "pattern(80, 56).convert('CMYK').save(d + '/cmyk.jpg', quality=95)\n"
         "dump(Image.open(d + '/cmyk.jpg'), d + '/cmyk.jpg.rgb')\n"
         // Without the Adobe marker the samples are taken as plain (not inverted) CMYK; PIL
         // always assumes Adobe's inversion, so its CMYK values here are 255 - stored.
         "j = open(d + '/cmyk.jpg', 'rb').read()\n"
         "i = j.index(b'\\xff\\xee')\n"
         "n = struct.unpack('>H', j[i + 2:i + 4])[0]\n"
         "open(d + '/plain_cmyk.jpg', 'wb').write(j[:i] + j[i + 2 + n:])\n"
         "c = np.asarray(Image.open(d + '/plain_cmyk.jpg')).astype(np.float64)\n"
         "rgb = np.round(c[..., :3] * c[..., 3:] / 255.0).astype(np.uint8)\n"
         "open(d + '/plain_cmyk.jpg.rgb', 'wb').write(rgb.tobytes())\n");
  EXPECT_EQ(probe_file(dir / "cmyk.jpg").channels, 4);
  expect_matches_pil(dir / "cmyk.jpg", 80, 56, 3);
  expect_matches_pil(dir / "plain_cmyk.jpg", 80, 56, 3);
  DecodeOptions o;
  o.region = {10, 20, 30, 20};
  const DecodedImage img = decode_file(dir / "cmyk.jpg", o);
  EXPECT_LE(max_abs_diff(img.pixels, crop(read_bytes(dir / "cmyk.jpg.rgb"), 80, o.region)), 3);
}

TEST(DecodeJpeg, GrayscaleGivesThreeEqualChannels) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "pattern(50, 30).convert('L').save(d + '/gray.jpg', quality=95)\n"
         "dump(Image.open(d + '/gray.jpg'), d + '/gray.jpg.rgb')\n");
  EXPECT_EQ(probe_file(dir / "gray.jpg").channels, 1);
  expect_matches_pil(dir / "gray.jpg", 50, 30, 1);
  const DecodedImage img = decode_file(dir / "gray.jpg");
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    ASSERT_EQ(img.pixels[i], img.pixels[i + 1]);
    ASSERT_EQ(img.pixels[i], img.pixels[i + 2]);
  }
}

TEST(DecodeRaw, RoundTripsRgbAndExpandsGray) {
  std::vector<uint8_t> rgb(size_t{5} * 7 * 3), gray(size_t{5} * 7);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 7);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t(i * 11);
  const std::vector<uint8_t> a = raw_image(5, 7, 3, rgb), g = raw_image(5, 7, 1, gray);
  EXPECT_EQ(detect_encoding(a.data(), a.size()), Encoding::kRaw);
  const ImageInfo info = probe_image(g.data(), g.size(), "g.raw");
  EXPECT_EQ(info.width, 7);
  EXPECT_EQ(info.height, 5);
  EXPECT_EQ(info.channels, 1);
  EXPECT_EQ(info.encoding, Encoding::kRaw);

  const DecodedImage img = decode_image(a.data(), a.size(), "a.raw");
  EXPECT_EQ(img.width, 7);
  EXPECT_EQ(img.height, 5);
  EXPECT_EQ(img.pixels, rgb);
  DecodeOptions o;
  o.region = {2, 1, 4, 3};
  o.min_width = 1;
  EXPECT_EQ(decode_image(a.data(), a.size(), "a.raw", o).pixels, crop(rgb, 7, o.region));
  const DecodedImage gi = decode_image(g.data(), g.size(), "g.raw", o);
  ASSERT_EQ(gi.pixels.size(), size_t(4 * 3 * 3));
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(gi.pixels[(y * 4 + x) * 3 + c], gray[(y + 1) * 7 + x + 2]);

  std::vector<uint8_t> short_raw(a.begin(), a.end() - 1), long_raw = a;
  long_raw.push_back(0);
  test::expect_bad_input([&] { decode_image(short_raw.data(), short_raw.size(), "short.raw"); },
                         {"short.raw", "truncated"});
  test::expect_bad_input([&] { decode_image(long_raw.data(), long_raw.size(), "long.raw"); }, {"long.raw", "expected"});
  const std::vector<uint8_t> two = raw_image(5, 7, 2, std::vector<uint8_t>(70));
  test::expect_bad_input([&] { probe_image(two.data(), two.size(), "two.raw"); }, {"two.raw", "2 channels"});
  const std::vector<uint8_t> huge = raw_image(1 << 20, 1 << 20, 3, {});
  test::expect_bad_input([&] { probe_image(huge.data(), huge.size(), "huge.raw"); }, {"huge.raw", "limit"});
  const std::vector<uint8_t> empty = raw_image(0, 7, 3, {});
  test::expect_bad_input([&] { decode_image(empty.data(), empty.size(), "empty.raw"); }, {"empty.raw", "no pixels"});
  test::expect_bad_input([&] { decode_image(a.data(), 10, "head.raw"); }, {"head.raw", "header"});
}

TEST(DecodeErrors, CorruptTruncatedAndForeignInputsNameTheSample) {
  test::TempDir dir;
  python("d = '" + dir.path() +
         "'\n"
         "img = pattern(160, 120, noise=20)\n"
         "img.save(d + '/a.jpg', quality=90)\n"
         "img.save(d + '/p.jpg', quality=90, progressive=True)\n"
         "img.save(d + '/a.png')\n"
         // Headers that declare more pixels than the decoder accepts (D5).
         "j = bytearray(open(d + '/a.jpg', 'rb').read())\n"
         "i = j.index(b'\\xff\\xc0')\n"
         "j[i + 5:i + 9] = struct.pack('>HH', 20000, 20000)\n"
         "open(d + '/huge.jpg', 'wb').write(j)\n"
         "p = bytearray(open(d + '/a.png', 'rb').read())\n"
         "p[16:20] = struct.pack('>I', 70000)\n"
         "p[29:33] = struct.pack('>I', zlib.crc32(bytes(p[12:29])) & 0xffffffff)\n"
         "open(d + '/wide.png', 'wb').write(p)\n");
  const std::vector<uint8_t> jpg = read_bytes(dir / "a.jpg"), prog = read_bytes(dir / "p.jpg"),
                             png = read_bytes(dir / "a.png");
  // Garbage over the middle of the entropy-coded data (a fixed LCG, so the test is repeatable).
  std::vector<uint8_t> corrupt = jpg;
  uint32_t state = 12345;
  for (size_t i = corrupt.size() / 2; i < corrupt.size() / 2 + 200; ++i) {
    state = state * 1664525u + 1013904223u;
    corrupt[i] = uint8_t(state >> 24);
  }
  test::expect_bad_input([&] { decode_image(corrupt.data(), corrupt.size(), "corrupt.jpg"); },
                         {"corrupt.jpg", "corrupt JPEG data"});

  const std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + jpg.size() * 6 / 10);
  test::expect_bad_input([&] { decode_image(cut.data(), cut.size(), "cut.jpg"); }, {"cut.jpg", "truncated JPEG"});
  // Decoding only the rows above the cut succeeds: they are complete.
  DecodeOptions top;
  top.region = {0, 0, 160, 8};
  EXPECT_EQ(decode_image(cut.data(), cut.size(), "cut.jpg", top).height, 8);
  const std::vector<uint8_t> cut_prog(prog.begin(), prog.begin() + prog.size() * 6 / 10);
  test::expect_bad_input([&] { decode_image(cut_prog.data(), cut_prog.size(), "cutp.jpg", top); },
                         {"cutp.jpg", "truncated JPEG"});
  const std::vector<uint8_t> header_only(jpg.begin(), jpg.begin() + 100);
  test::expect_bad_input([&] { probe_image(header_only.data(), header_only.size(), "head.jpg"); }, {"head.jpg"});

  const std::vector<uint8_t> cut_png(png.begin(), png.begin() + png.size() * 6 / 10);
  test::expect_bad_input([&] { decode_image(cut_png.data(), cut_png.size(), "cut.png"); }, {"cut.png", "PNG"});
  std::vector<uint8_t> bad_crc = png;
  bad_crc[bad_crc.size() / 2] ^= 0x55;
  test::expect_bad_input([&] { decode_image(bad_crc.data(), bad_crc.size(), "crc.png"); }, {"crc.png", "PNG"});

  std::vector<uint8_t> noise(3000);
  for (auto& b : noise) {
    state = state * 1664525u + 1013904223u;
    b = uint8_t(state >> 24);
  }
  noise[0] = 'x';
  test::expect_bad_input([&] { decode_image(noise.data(), noise.size(), "noise.bin"); },
                         {"noise.bin", "unsupported image format"});
  test::expect_bad_input([&] { probe_image(noise.data(), 0, "empty.bin"); }, {"empty.bin", "empty"});
  // Right magic, random rest.
  std::vector<uint8_t> fake_jpeg = noise, fake_png = noise;
  std::memcpy(fake_jpeg.data(), "\xFF\xD8\xFF", 3);
  std::memcpy(fake_png.data(), "\x89PNG\r\n\x1a\n", 8);
  test::expect_bad_input([&] { decode_image(fake_jpeg.data(), fake_jpeg.size(), "fake.jpg"); }, {"fake.jpg", "JPEG"});
  test::expect_bad_input([&] { decode_image(fake_png.data(), fake_png.size(), "fake.png"); }, {"fake.png", "PNG"});

  test::expect_bad_input([&] { probe_file(dir / "huge.jpg"); }, {"huge.jpg", "20000x20000", "limit"});
  test::expect_bad_input([&] { decode_file(dir / "huge.jpg"); }, {"huge.jpg", "limit"});
  test::expect_bad_input([&] { probe_file(dir / "wide.png"); }, {"wide.png", "limit"});

  DecodeOptions outside;
  outside.region = {150, 0, 11, 10};
  test::expect_bad_input([&] { decode_image(jpg.data(), jpg.size(), "a.jpg", outside); }, {"a.jpg", "outside"});
  test::expect_bad_input([&] { decode_image(png.data(), png.size(), "a.png", outside); }, {"a.png", "outside"});
}

TEST(DecodeEncode, JpegRoundTripIsClose) {
  const int w = 96, h = 64;
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
      p[0] = uint8_t(x * 255 / (w - 1));
      p[1] = uint8_t(y * 255 / (h - 1));
      p[2] = uint8_t(128 + 60 * ((x / 16 + y / 16) % 2));
    }
  const std::vector<uint8_t> jpg = encode_jpeg(rgb.data(), w, h, 95);
  ASSERT_GT(jpg.size(), 100u);
  EXPECT_EQ(detect_encoding(jpg.data(), jpg.size()), Encoding::kJpeg);
  const DecodedImage img = decode_image(jpg.data(), jpg.size(), "enc.jpg");
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.height, h);
  EXPECT_LT(mean_abs_diff(img.pixels, rgb), 3.0);
  EXPECT_LT(encode_jpeg(rgb.data(), w, h, 20).size(), jpg.size());
  // PIL reads it as 4:2:0 at the same size.
  test::TempDir dir;
  test::write_text(dir / "enc.jpg", std::string(jpg.begin(), jpg.end()));
  EXPECT_EQ(python("im = Image.open('" + (dir / "enc.jpg") +
                   "')\n"
                   "from PIL import JpegImagePlugin\n"
                   "print(im.size, JpegImagePlugin.get_sampling(im))\n"),
            "(96, 64) 2\n");
  test::expect_bad_input([&] { encode_jpeg(rgb.data(), w, h, 0); }, {"quality"});
  test::expect_bad_input([&] { encode_jpeg(rgb.data(), 0, h, 90); }, {"0x64"});
}

// The fuzz seed corpus (fuzz/corpus/image/: PIL's files plus odd samplings, restart markers and
// arithmetic coding) decodes whole, probes consistently, and its regions are crops of the whole.
TEST(DecodeFuzzCorpus, SeedsDecode) {
  // The source tree from the support folder's absolute path (__FILE__ is relative to the build
  // folder, so reading the corpus through it found nothing and the test skipped unseen).
  const std::string root = CRUCIBLE_TEST_SUPPORT_DIR "/../..";
  const std::string list = test::run_python("import os\nd = '" + root +
                                            "/fuzz/corpus/image'\n"
                                            "print('\\n'.join(sorted(os.listdir(d))) if os.path.isdir(d) else '')\n");
  std::istringstream in(list);
  std::string name;
  int n = 0;
  while (std::getline(in, name)) {
    if (name.empty()) continue;
    const std::string path = root + "/fuzz/corpus/image/" + name;
    SCOPED_TRACE(path);
    const ImageInfo info = probe_file(path);
    const DecodedImage img = decode_file(path);
    EXPECT_EQ(img.width, info.width);
    EXPECT_EQ(img.height, info.height);
    EXPECT_EQ(img.pixels.size(), size_t(info.width) * info.height * 3);
    const int w = info.width, h = info.height;
    for (const Rect& r : {Rect{0, 0, 1, 1}, Rect{w - 1, h - 1, 1, 1}, Rect{w / 3, h / 4, w / 2, h / 2}}) {
      DecodeOptions o;
      o.region = r;
      EXPECT_EQ(decode_file(path, o).pixels, crop(img.pixels, w, r)) << r.x << "," << r.y;
      // Scaled (JPEG only): the spec's size for the smallest M covering half the region.
      o.min_width = std::max(1, r.width / 2);
      o.min_height = std::max(1, r.height / 2);
      int m = 1;
      while (
          info.encoding == Encoding::kJpeg && m < 8 &&
          (spec_span(r.x, r.width, w, m).second < o.min_width || spec_span(r.y, r.height, h, m).second < o.min_height))
        ++m;
      if (info.encoding != Encoding::kJpeg) m = 8;
      const DecodedImage scaled = decode_file(path, o);
      EXPECT_EQ(scaled.width, spec_span(r.x, r.width, w, m).second);
      EXPECT_EQ(scaled.height, spec_span(r.y, r.height, h, m).second);
    }
    ++n;
  }
  EXPECT_GT(n, 10) << "the seed corpus " << root << "/fuzz/corpus/image is part of the tree";
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

// The pipeline's fast JPEG settings (integer IDCT, merged chroma upsampling) stay within a few
// levels of libjpeg's accurate defaults.
TEST(DecodeJpeg, FastSettingsStayCloseToAccurate) {
  test::TempDir dir;
  test::run_python("import numpy as np\nfrom PIL import Image\n"
                   "y, x = np.mgrid[0:180, 0:240]\n"
                   "rng = np.random.default_rng(0)\n"
                   "a = np.stack([x, y * 1.4, (x + y) / 2], -1) + rng.normal(0, 6, (180, 240, 3))\n"
                   "a = np.clip(a, 0, 255).astype(np.uint8)  # photo-like: smooth gradients, sensor noise\n"
                   "Image.fromarray(a).save('" + (dir / "a.jpg") + "', quality=90)\n");
  const std::string bytes = test::read_text(dir / "a.jpg");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  DecodeOptions fast;
  fast.fast = true;
  const DecodedImage a = decode_image(p, bytes.size(), "a.jpg");
  const DecodedImage b = decode_image(p, bytes.size(), "a.jpg", fast);
  ASSERT_EQ(a.pixels.size(), b.pixels.size());
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  EXPECT_LT(sum / a.pixels.size(), 3.0);
  EXPECT_NE(a.pixels, b.pixels);  // the settings are really applied
}

}  // namespace
}  // namespace crucible::data
