// libFuzzer target: image probing and decoding (JPEG, PNG, raw CRWP), whole and by region with
// DCT scaling. One region and minimum size come from the input's last 8 bytes (after a JPEG's
// EOI or a PNG's IEND they change nothing else), so the fuzzer can steer them; three more come
// from a hash of the input.
#include <algorithm>

#include "crucible/data/image/decode.h"
#include "fuzz_common.h"

namespace {

using namespace crucible::data;

// Images larger than this are probed but not decoded, as libjpeg-turbo's own fuzzers do: a
// tiny file may legitimately declare 100 megapixels, which costs time, not bugs.
constexpr int64_t kMaxFuzzPixels = 1 << 20;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "decoder invariant broken: %s\n", what);
    std::abort();
  }
}

void check_shape(const DecodedImage& img, const Rect& region) {
  check(img.region.x == region.x && img.region.y == region.y && img.region.width == region.width &&
            img.region.height == region.height,
        "region echoes the request");
  check(img.width >= 1 && img.height >= 1 && img.width <= region.width && img.height <= region.height,
        "size within the region");
  check(img.pixels.size() == size_t(img.width) * img.height * 3, "pixels are [height, width, 3]");
}

// Decodes the region and minimum size that 8 bytes `b` select inside `info`'s image and checks
// the result against the contract and, at full scale, against `full` (when `whole` decoded).
void check_region(const uint8_t* data, size_t size, const ImageInfo& info, bool whole, const DecodedImage& full,
                  const uint8_t* b) {
  const int w = info.width, h = info.height;
  Rect r;
  r.x = b[0] * w / 256;
  r.y = b[1] * h / 256;
  r.width = 1 + b[2] * (w - r.x - 1) / 255;
  r.height = 1 + b[3] * (h - r.y - 1) / 255;
  DecodeOptions options;
  options.region = r;
  options.min_width = (b[6] & 0x10) ? 0 : b[4] * r.width / 128;
  options.min_height = (b[6] & 0x20) ? 0 : b[5] * r.height / 128;
  const bool outside = (b[6] & 0x0F) == 0x0F;
  if (outside) options.region.x = w - r.width + 1;  // one column past the right edge
  bool ok = false;
  fuzz_one([&] {
    const DecodedImage img = decode_image(data, size, "fuzz.img", options);
    ok = true;
    check_shape(img, r);
    if (options.min_width > 0 && options.min_width <= r.width) check(img.width >= options.min_width, "min width");
    if (options.min_height > 0 && options.min_height <= r.height) check(img.height >= options.min_height, "min height");
    const bool full_scale = options.min_width <= 0 && options.min_height <= 0;
    if (info.encoding != Encoding::kJpeg) check(img.width == r.width && img.height == r.height, "only JPEG is scaled");
    // At full scale a region is exactly the crop of the whole image (for JPEG too: the decoder
    // crops with a margin, and the rows above are entropy-decoded either way).
    if (whole && (full_scale || info.encoding != Encoding::kJpeg)) {
      for (int y = 0; y < r.height; ++y)
        check(std::equal(img.pixels.begin() + size_t(y) * r.width * 3, img.pixels.begin() + size_t(y + 1) * r.width * 3,
                         full.pixels.begin() + (size_t(r.y + y) * w + r.x) * 3),
              "a region is the crop of the whole image");
    }
  });
  check(!(ok && outside), "a region outside the image is refused");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)encoding_name(detect_encoding(data, size));
  ImageInfo info;
  bool probed = false;
  fuzz_one([&] {
    info = probe_image(data, size, "fuzz.img");
    probed = true;
  });
  if (!probed) {
    // The decoder reads the same header: it must refuse too.
    bool decoded = false;
    fuzz_one([&] {
      (void)decode_image(data, size, "fuzz.img");
      decoded = true;
    });
    check(!decoded, "decode accepts what probe refused");
    return 0;
  }
  check(info.width >= 1 && info.height >= 1, "probe gives a size");
  check(info.orientation >= 1 && info.orientation <= 8, "orientation 1-8");
  if (int64_t(info.width) * info.height > kMaxFuzzPixels) return 0;

  DecodedImage full;
  bool whole = false;
  fuzz_one([&] {
    full = decode_image(data, size, "fuzz.img");
    check_shape(full, Rect{0, 0, info.width, info.height});
    check(full.width == info.width && full.height == info.height, "full decode has the probed size");
    whole = true;
  });

  uint8_t b[8] = {};
  for (size_t i = 0; i < 8 && i < size; ++i) b[i] = data[size - 1 - i];
  check_region(data, size, info, whole, full, b);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211ull;
  for (int k = 0; k < 3; ++k) {
    for (uint8_t& v : b) {
      hash = hash * 6364136223846793005ull + 1442695040888963407ull;
      v = uint8_t(hash >> 56);
    }
    check_region(data, size, info, whole, full, b);
  }
  return 0;
}
