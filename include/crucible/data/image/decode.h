// Image decoding for the pipeline (D2, D3, D5, D7). JPEG through libjpeg-turbo's libjpeg API:
// only the requested region is decoded (rows below it are never read, columns outside it are
// cropped at iMCU granularity) at the smallest DCT scale M/8 that still covers the size the
// region will be resized to (D2: never decode larger than needed). PNG through libspng.
// Grayscale, palette, 16-bit and CMYK inputs are converted, and EXIF orientation is applied, so
// the output is always RGB in display orientation (D3). Single-threaded by construction (D7):
// each call uses only the calling thread. Thread-safe: calls share no state. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::data {

enum class Encoding : uint8_t { kJpeg, kPng, kRaw, kUnknown };

// Raw pixel samples, as `crucible pack --raw` stores them: the magic "CRWP", u32 LE height,
// width and channels (1 or 3), then [height, width, channels] uint8.
constexpr char kRawMagic[4] = {'C', 'R', 'W', 'P'};
constexpr size_t kRawHeaderBytes = 16;

// From the first bytes: JPEG (FF D8 FF), PNG (89 50 4E 47 0D 0A 1A 0A), raw ("CRWP").
Encoding detect_encoding(const uint8_t* data, size_t size);
const char* encoding_name(Encoding e);

// Header facts, without decoding pixels.
struct ImageInfo {
  int width = 0;        // as displayed: after EXIF orientation (5–8 swap width and height)
  int height = 0;
  int channels = 0;     // stored channels (1 gray, 3 RGB/YCbCr, 4 CMYK/RGBA); output is RGB
  int orientation = 1;  // EXIF orientation 1–8 (JPEG; 1 for others)
  Encoding encoding = Encoding::kUnknown;
};

// Reads only the header. Throws crucible::Error (bad input) naming `name` and the problem.
// `exif_orientation` false: a JPEG's orientation tag is ignored (orientation 1, stored size), as
// DecodeOptions::exif_orientation.
ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& name, bool exif_orientation = true);

// A rectangle in display coordinates (after orientation) of the full-resolution image.
struct Rect {
  int x = 0, y = 0, width = 0, height = 0;
  bool empty() const { return width <= 0 || height <= 0; }
};

struct DecodeOptions {
  Rect region;          // the part of the displayed image to return; empty = the whole image
  int min_width = 0;    // the returned pixels may be scaled down, but never below this size:
  int min_height = 0;   // the smallest M/8 with scaled region ≥ min (0 = full resolution)
  // JPEG: libjpeg-turbo's fast integer IDCT and merged (non-"fancy") chroma upsampling, as
  // FFCV decodes: ~10% faster, pixels within a few levels of the accurate decode.
  bool fast = false;
  // JPEG: decode at a reduced DCT scale (M/8) when min_width/min_height allow it (D2). Off: always
  // at full resolution, as torchvision and PIL decode, then resized (the region is still decoded
  // alone).
  bool dct_scaling = true;
  // JPEG: apply the EXIF orientation tag, so pixels come as a viewer shows the photo. Off: the
  // stored orientation, as torchvision.io.decode_jpeg (apply_exif_orientation=False) and
  // PIL's Image.open give them.
  bool exif_orientation = true;
  // JPEG: the pixels may keep the columns libjpeg decodes beside the region (its crop starts at
  // an iMCU boundary), saving a copy of every row; read them through DecodedImage::data() and
  // stride(). Other formats, and rotated or CMYK JPEGs, come contiguous all the same.
  bool padded_rows = false;
  // With padded_rows: storage to decode into (swapped into DecodedImage::pixels; swap it back
  // after, for the next image). It is grown, never shrunk or cleared, so an image costs no
  // allocation and no zero-fill, and `pixels` may be longer than the rows it holds.
  std::vector<uint8_t>* recycle = nullptr;
};

// [height, width, 3] uint8 RGB pixels of `region` (exactly that region, in display
// orientation) at scale (width / region.width) ≈ (height / region.height) = M/8 ≤ 1.
struct DecodedImage {
  std::vector<uint8_t> pixels;
  int width = 0;
  int height = 0;
  Rect region;  // the region these pixels cover, in full-resolution display coordinates
  // With DecodeOptions::padded_rows: the first pixel's byte offset in `pixels` and the bytes
  // from one row to the next (0: contiguous [height, width, 3]).
  size_t offset = 0, row_stride = 0;

  const uint8_t* data() const { return pixels.data() + offset; }
  size_t stride() const { return row_stride > 0 ? row_stride : static_cast<size_t>(width) * 3; }
};

// Decodes `data`. Throws crucible::Error (bad input) naming `name` and what is wrong for
// corrupt, truncated or unsupported data (D5: the caller's policy decides skip or fail).
DecodedImage decode_image(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& options = {});

// Encodes RGB pixels as JPEG at `quality` (for `crucible pack --max-side` and tests).
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality);

}  // namespace crucible::data
