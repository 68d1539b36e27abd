// Image decoders behind decode.h: JPEG through libjpeg-turbo's libjpeg API (region crop, DCT
// scaling, EXIF orientation, CMYK), PNG through libspng, and crucible's raw "CRWP" samples.
// libjpeg reports errors by longjmp: the one setjmp lives in run_guarded(), whose callers' state
// is POD and whose bodies hold no object with a destructor, so a jump skips no C++ cleanup.
#include "crucible/data/image/decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <jerror.h>  // the message codes (JWRN_*)
#include <jpeglib.h>
#include <spng.h>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"

namespace crucible::data {
namespace {

// D5: a crafted header must not make us allocate more than a real image of that size needs.
constexpr int64_t kMaxPixels = 100'000'000;
constexpr uint32_t kMaxSide = 65535;          // JPEG's own limit is 65500
constexpr int kJpegScanLimit = 500;           // progressive scans (libjpeg-turbo's fuzzers use 500)
constexpr long kJpegMemoryLimit = 2L << 30;   // libjpeg's pools, incl. a progressive coefficient buffer
constexpr size_t kPngCacheLimit = 64u << 20;  // ancillary chunks libspng keeps
constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

void check_pixels(const std::string& name, const char* kind, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) throw bad_input("{}: {} image has no pixels ({}x{})", name, kind, width, height);
  if (width > kMaxSide || height > kMaxSide || width * height > kMaxPixels)
    throw bad_input("{}: {} image is {}x{}, over the limit of {} pixels (at most {} a side)", name, kind, width, height,
                    kMaxPixels, kMaxSide);
}


// ---- geometry ---------------------------------------------------------------------------------

// Half-open interval [begin, end).
struct Span {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// [start, start+len) of an axis of `full` pixels, scaled by m/8 as libjpeg scales the image
// (ceil(full*m/8) pixels): floor at the start, ceil at the end, clamped to the scaled image and
// to len pixels (a 1-pixel region straddling two scaled pixels stays 1 pixel, so M/8 ≤ 1 holds).
// Never empty for len > 0.
Span scaled_span(int64_t start, int64_t len, int64_t full, int m) {
  const int64_t scaled_full = (full * m + 7) / 8;
  const int64_t begin = start * m / 8;
  const int64_t end = ((start + len) * m + 7) / 8;
  return {begin, std::min({end, scaled_full, begin + len})};
}

Span flip(Span s, int64_t n) {
  return {n - s.end, n - s.begin};
}

// EXIF orientation o (display = o applied to stored): whether display x runs along stored rows
// (5–8 transpose), and which stored axes run backwards.
bool transposes(int o) {
  return o >= 5 && o <= 8;
}
bool flips_stored_x(int o) {
  return o == 2 || o == 3 || o == 7 || o == 8;
}
bool flips_stored_y(int o) {
  return o == 3 || o == 4 || o == 6 || o == 7;
}

// The whole image when `r` is empty; otherwise `r`, which must lie inside width x height.
Rect resolve_region(const Rect& r, int width, int height, const std::string& name) {
  if (r.empty()) return Rect{0, 0, width, height};
  if (r.x < 0 || r.y < 0 || int64_t(r.x) + r.width > width || int64_t(r.y) + r.height > height)
    throw bad_input("{}: region {}x{} at ({}, {}) lies outside the {}x{} image", name, r.width, r.height, r.x, r.y,
                    width, height);
  return r;
}

// D2: the smallest M in {1, 2, 4, 8} whose scaled region is at least min_width x min_height (a
// non-positive minimum constrains nothing; both non-positive = full resolution).
int choose_scale(const Rect& r, int width, int height, int min_width, int min_height) {
  if (min_width <= 0 && min_height <= 0) return 8;
  for (int m : {1, 2, 4}) {  // powers of two: libjpeg-turbo has SIMD IDCTs only for 1/8, 1/4, 1/2, 1/1
    const bool wide = min_width <= 0 || scaled_span(r.x, r.width, width, m).size() >= min_width;
    const bool tall = min_height <= 0 || scaled_span(r.y, r.height, height, m).size() >= min_height;
    if (wide && tall) return m;
  }
  return 8;
}

// dst [dh, dw, 3] = orientation `o` applied to src [sh, sw, 3] (dw x dh = sw x sh, swapped for 5–8).
void apply_orientation(const uint8_t* src, int sw, int sh, int o, uint8_t* dst) {
  const bool t = transposes(o), fx = flips_stored_x(o), fy = flips_stored_y(o);
  const int dw = t ? sh : sw, dh = t ? sw : sh;
  for (int v = 0; v < dh; ++v) {
    uint8_t* out = dst + size_t(v) * dw * 3;
    for (int u = 0; u < dw; ++u) {
      int s = t ? v : u, r = t ? u : v;
      if (fx) s = sw - 1 - s;
      if (fy) r = sh - 1 - r;
      std::memcpy(out + size_t(u) * 3, src + (size_t(r) * sw + s) * 3, 3);
    }
  }
}

// Copies rows [y, y+h) and columns [x, x+w) of an RGB (channels 3) or gray (1) image of row
// length `width` into [h, w, 3] RGB (D3: gray is expanded).
void copy_region_rgb(const uint8_t* src, int width, int channels, const Rect& r, uint8_t* dst) {
  for (int y = 0; y < r.height; ++y) {
    const uint8_t* in = src + (size_t(r.y + y) * width + r.x) * channels;
    uint8_t* out = dst + size_t(y) * r.width * 3;
    if (channels == 3) {
      std::memcpy(out, in, size_t(r.width) * 3);
    } else {
      for (size_t x = 0; x < size_t(r.width); ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    }
  }
}

// ---- EXIF -------------------------------------------------------------------------------------

// The orientation tag (0x0112) of IFD0 in an APP1 payload ("Exif\0\0" + TIFF, either byte
// order), or 0 when absent or malformed. Every read is bounds-checked against n.
int exif_orientation(const uint8_t* p, size_t n) {
  static const uint8_t kExif[6] = {'E', 'x', 'i', 'f', 0, 0};
  if (n < 6 + 8 || std::memcmp(p, kExif, 6) != 0) return 0;
  const uint8_t* t = p + 6;
  const size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') {
    le = true;
  } else if (t[0] == 'M' && t[1] == 'M') {
    le = false;
  } else {
    return 0;
  }
  auto u16 = [&](size_t off) -> uint32_t {
    return le ? uint32_t(t[off]) | uint32_t(t[off + 1]) << 8 : uint32_t(t[off]) << 8 | uint32_t(t[off + 1]);
  };
  auto u32 = [&](size_t off) -> uint32_t { return le ? u16(off) | u16(off + 2) << 16 : u16(off) << 16 | u16(off + 2); };
  if (u16(2) != 42) return 0;
  const size_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 0;
  const uint32_t count = u16(ifd);
  for (uint32_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + size_t(i) * 12;
    if (tn - ifd - 2 < (size_t(i) + 1) * 12) return 0;  // entry e..e+12 past the end
    if (u16(e) != 0x0112) continue;
    const uint32_t type = u16(e + 2), n_values = u32(e + 4);
    uint32_t v = 0;
    if (type == 3 && n_values >= 1) {
      v = u16(e + 8);  // SHORT, left-justified in the value field
    } else if (type == 4 && n_values >= 1) {
      v = u32(e + 8);  // LONG (off-spec, seen in the wild)
    }
    return v >= 1 && v <= 8 ? int(v) : 0;
  }
  return 0;
}

// ---- JPEG: the setjmp boundary ----------------------------------------------------------------

// libjpeg's error manager plus the jump target and the failure text. POD.
struct JpegErrorMgr {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool ours;  // the message is crucible's (a limit, a bug check), not libjpeg's
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

[[noreturn]] void jpeg_fail_with(j_common_ptr cinfo, const char* text) {
  auto* err = reinterpret_cast<JpegErrorMgr*>(cinfo->err);
  err->ours = true;
  std::snprintf(err->message, sizeof err->message, "%s", text);
  std::longjmp(err->jump, 1);
}

// Warnings (msg_level -1) about metadata are ignored; every "corrupt data" warning fails the
// decode (D5: reported, never silently grey): premature end (libjpeg would grey-fill), bad
// Huffman code, lost sync, and extraneous bytes before a marker (the sign that the entropy
// data desynchronised, as garbage in the middle of a file does; also seen, benign, at the end
// of some camera files, which are then refused too). Trace messages are dropped.
void jpeg_emit(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;
  switch (cinfo->err->msg_code) {
    case JWRN_JFIF_MAJOR:   // unknown JFIF version
    case JWRN_ADOBE_XFORM:  // unknown Adobe transform: libjpeg guesses from the components
    case JWRN_BOGUS_ICC:    // a broken ICC marker; we do not read ICC profiles
      cinfo->err->num_warnings++;
      return;
    default:
      jpeg_fail(cinfo);
  }
}

void jpeg_output_nothing(j_common_ptr) {}

// Bounds the work a crafted progressive file can ask for.
void jpeg_scan_limit(j_common_ptr cinfo) {
  if (cinfo->is_decompressor && reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kJpegScanLimit) {
    char text[64];
    std::snprintf(text, sizeof text, "more than %d progressive scans", kJpegScanLimit);
    jpeg_fail_with(cinfo, text);
  }
}

// One libjpeg object and its managers. POD; zero-initialise before use.
template <typename Cinfo>
struct JpegSession {
  Cinfo cinfo;
  JpegErrorMgr err;
  jpeg_progress_mgr progress;
};
using JpegDecompress = JpegSession<jpeg_decompress_struct>;
using JpegCompress = JpegSession<jpeg_compress_struct>;

// Runs body(session, arg) and destroys the libjpeg object; false (with session->err.message)
// when libjpeg failed. The only setjmp in this file: body must create the libjpeg object and
// must hold no object with a non-trivial destructor (a longjmp would skip it).
template <typename Session>
bool run_guarded(Session* s, void (*body)(Session*, void*), void* arg) {
  jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = jpeg_fail;
  s->err.pub.emit_message = jpeg_emit;
  s->err.pub.output_message = jpeg_output_nothing;
  s->err.ours = false;
  s->err.message[0] = '\0';
  s->cinfo.err = &s->err.pub;
  if (setjmp(s->err.jump) != 0) {
    jpeg_destroy(reinterpret_cast<j_common_ptr>(&s->cinfo));  // safe on a half-created object
    return false;
  }
  body(s, arg);
  jpeg_destroy(reinterpret_cast<j_common_ptr>(&s->cinfo));
  return true;
}

void jpeg_open(JpegDecompress* s, const uint8_t* data, size_t size) {
  jpeg_create_decompress(&s->cinfo);
  s->cinfo.mem->max_memory_to_use = kJpegMemoryLimit;  // beyond it: "backing store" error, no allocation
  s->progress.progress_monitor = jpeg_scan_limit;
  s->cinfo.progress = &s->progress;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
}

// What the header says. POD.
struct JpegHeader {
  const uint8_t* data;
  size_t size;
  int width, height;  // stored
  int components;
  J_COLOR_SPACE color_space;
  bool adobe;       // an Adobe APP14 marker: CMYK samples are stored inverted
  int orientation;  // 1–8
};

void jpeg_header_body(JpegDecompress* s, void* arg) {
  auto* h = static_cast<JpegHeader*>(arg);
  jpeg_open(s, h->data, h->size);
  jpeg_save_markers(&s->cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&s->cinfo, TRUE);
  h->width = int(s->cinfo.image_width);
  h->height = int(s->cinfo.image_height);
  h->components = s->cinfo.num_components;
  h->color_space = s->cinfo.jpeg_color_space;
  h->adobe = s->cinfo.saw_Adobe_marker;
  h->orientation = 1;
  for (jpeg_saved_marker_ptr m = s->cinfo.marker_list; m != nullptr; m = m->next) {
    const int o = m->marker == JPEG_APP0 + 1 ? exif_orientation(m->data, m->data_length) : 0;
    if (o != 0) {
      h->orientation = o;
      break;
    }
  }
}

// A stored-orientation rectangle of the image scaled by scale/8, written as RGB. POD.
struct JpegDecodeJob {
  const uint8_t* data;
  size_t size;
  int scale;                        // M of M/8
  int scaled_width, scaled_height;  // the whole scaled image, as the caller computed it
  int x, y, width, height;          // the rectangle, in scaled stored pixels
  bool cmyk;                        // decode as CMYK and convert (CMYK and YCCK files)
  bool adobe;
  bool fast;     // integer fast IDCT + merged chroma upsampling (DecodeOptions::fast)
  uint8_t* out;  // [height, width, 3], owned by the caller
  // Instead of `out` (not for CMYK): rows decoded in place, libjpeg's cropped columns and all;
  // `offset` and `row_stride` say where the rectangle is in them.
  std::vector<uint8_t>* padded;
  size_t offset, row_stride;
};

void cmyk_to_rgb(const JSAMPLE* in, int n, bool inverted, uint8_t* out) {
  for (int i = 0; i < n; ++i, in += 4, out += 3) {
    const unsigned k = inverted ? in[3] : 255u - in[3];
    for (int c = 0; c < 3; ++c) out[c] = uint8_t(((inverted ? in[c] : 255u - in[c]) * k + 127) / 255);
  }
}

void jpeg_decode_body(JpegDecompress* s, void* arg) {
  auto* job = static_cast<JpegDecodeJob*>(arg);
  j_decompress_ptr cinfo = &s->cinfo;
  jpeg_open(s, job->data, job->size);
  jpeg_read_header(cinfo, TRUE);
  cinfo->out_color_space = job->cmyk ? JCS_CMYK : JCS_RGB;  // D3: YCbCr and gray → RGB by libjpeg
  // Block smoothing guesses AC coefficients a progressive file never sent (scans missing); with a
  // column crop it guesses differently at the edges, so a region would not be the crop of the
  // whole image. Complete files are unaffected.
  cinfo->do_block_smoothing = FALSE;
  if (job->fast) {
    cinfo->dct_method = JDCT_IFAST;
    cinfo->do_fancy_upsampling = FALSE;
  }
  cinfo->scale_num = unsigned(job->scale);
  cinfo->scale_denom = 8;
  jpeg_calc_output_dimensions(cinfo);
  if (int(cinfo->output_width) != job->scaled_width || int(cinfo->output_height) != job->scaled_height)
    jpeg_fail_with(reinterpret_cast<j_common_ptr>(cinfo), "scaled size differs from the header's (internal)");
  jpeg_start_decompress(cinfo);  // a progressive file is read whole here (the scan limit applies)

  // Crop columns: libjpeg widens the start down to an iMCU boundary. One iMCU of margin on
  // each side gives fancy upsampling its real neighbours, so the crop equals the full decode.
  const int64_t align = int64_t(cinfo->min_DCT_scaled_size) * cinfo->max_h_samp_factor;
  const int64_t left = std::max<int64_t>(0, job->x - align);
  const int64_t right = std::min<int64_t>(cinfo->output_width, int64_t(job->x) + job->width + align);
  auto crop_x = JDIMENSION(left);
  auto crop_width = JDIMENSION(right - left);
  jpeg_crop_scanline(cinfo, &crop_x, &crop_width);
  if (int64_t(crop_x) > job->x || int64_t(crop_x) + crop_width < int64_t(job->x) + job->width)
    jpeg_fail_with(reinterpret_cast<j_common_ptr>(cinfo), "crop does not cover the region (internal)");
  const int comps = cinfo->output_components;
  // Rows are read a row group at a time (rec_outbuf_height: 2 with merged h2v2 upsampling):
  // asked for one, libjpeg decodes the pair into a spare row and copies it out (8% of a decode).
  const int group = std::min(16, std::max(1, cinfo->rec_outbuf_height));  // ≤ max_v_samp_factor ≤ 4
  const size_t stride = size_t(crop_width) * size_t(comps);
  const size_t offset = size_t(job->x - int64_t(crop_x)) * comps;
  // In place (job->padded): straight into the caller's rows, no copy. Else into a scratch row
  // group, copied (or converted from CMYK) into `out`.
  JSAMPARRAY scratch = nullptr;
  if (job->padded != nullptr) {
    if (job->padded->size() < stride * size_t(job->height)) job->padded->resize(stride * size_t(job->height));
    job->offset = offset;
    job->row_stride = stride;
  } else {
    scratch = (*cinfo->mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE, JDIMENSION(stride),
                                          JDIMENSION(group));
  }

  auto skip = JDIMENSION(job->y);  // rows above are entropy-decoded but not upsampled
  while (skip > 0) {
    const JDIMENSION n = jpeg_skip_scanlines(cinfo, skip);
    if (n == 0) jpeg_fail_with(reinterpret_cast<j_common_ptr>(cinfo), "cannot skip scanlines");
    skip -= std::min(n, skip);
  }
  JSAMPROW into[16];
  for (int r = 0; r < job->height;) {
    const int want = std::min(group, job->height - r);
    for (int k = 0; k < want; ++k) into[k] = scratch ? scratch[k] : job->padded->data() + size_t(r + k) * stride;
    const JDIMENSION got = jpeg_read_scanlines(cinfo, into, JDIMENSION(want));
    if (got == 0) jpeg_fail_with(reinterpret_cast<j_common_ptr>(cinfo), "no scanline");
    for (JDIMENSION k = 0; scratch != nullptr && k < got; ++k) {
      uint8_t* out = job->out + size_t(r + int(k)) * job->width * 3;
      if (job->cmyk) {
        cmyk_to_rgb(into[k] + offset, job->width, job->adobe, out);
      } else {
        std::memcpy(out, into[k] + offset, size_t(job->width) * 3);
      }
    }
    r += int(got);
  }
  if (cinfo->output_scanline == cinfo->output_height) {
    jpeg_finish_decompress(cinfo);  // reads on to EOI: trailing garbage is reported
  } else {
    jpeg_abort_decompress(cinfo);  // rows below the region are never read (D2)
  }
}

struct JpegEncodeJob {
  const uint8_t* rgb;
  int width, height, quality;
  unsigned char* out;  // in: a buffer of out_size bytes; out: where libjpeg put the file
  unsigned long out_size;
};

void jpeg_encode_body(JpegCompress* s, void* arg) {
  auto* job = static_cast<JpegEncodeJob*>(arg);
  j_compress_ptr cinfo = &s->cinfo;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, &job->out, &job->out_size);
  cinfo->image_width = JDIMENSION(job->width);
  cinfo->image_height = JDIMENSION(job->height);
  cinfo->input_components = 3;
  cinfo->in_color_space = JCS_RGB;
  jpeg_set_defaults(cinfo);  // YCbCr, 2x2 luma sampling (4:2:0)
  jpeg_set_quality(cinfo, job->quality, TRUE);
  jpeg_start_compress(cinfo, TRUE);
  while (cinfo->next_scanline < cinfo->image_height) {
    auto row = const_cast<JSAMPROW>(job->rgb + size_t(cinfo->next_scanline) * job->width * 3);
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
}

// ---- JPEG: C++ side ---------------------------------------------------------------------------

[[noreturn]] void throw_jpeg(const std::string& name, const JpegErrorMgr& err) {
  if (err.ours) throw bad_input("{}: corrupt JPEG data: {}", name, err.message);
  if (err.pub.msg_code == JWRN_JPEG_EOF) throw bad_input("{}: truncated JPEG (premature end of data)", name);
  const char* text = err.message;
  static const char kPrefix[] = "Corrupt JPEG data: ";
  if (std::strncmp(text, kPrefix, sizeof kPrefix - 1) == 0) text += sizeof kPrefix - 1;
  throw bad_input("{}: corrupt JPEG data: {}", name, text);
}

JpegHeader read_jpeg_header(const uint8_t* data, size_t size, const std::string& name) {
  JpegHeader h{};
  h.data = data;
  h.size = size;
  auto s = std::make_unique<JpegDecompress>();  // value-initialised: all zero
  if (!run_guarded(s.get(), jpeg_header_body, &h)) throw_jpeg(name, s->err);
  const bool ok = (h.color_space == JCS_GRAYSCALE && h.components == 1) ||
                  ((h.color_space == JCS_YCbCr || h.color_space == JCS_RGB) && h.components == 3) ||
                  ((h.color_space == JCS_CMYK || h.color_space == JCS_YCCK) && h.components == 4);
  if (!ok)
    throw bad_input("{}: unsupported JPEG color space (libjpeg code {}, {} components)", name, int(h.color_space),
                    h.components);
  check_pixels(name, "JPEG", h.width, h.height);
  return h;
}

ImageInfo probe_jpeg(const uint8_t* data, size_t size, const std::string& name, bool exif_orientation) {
  JpegHeader h = read_jpeg_header(data, size, name);
  if (!exif_orientation) h.orientation = 1;
  ImageInfo info;
  info.width = transposes(h.orientation) ? h.height : h.width;
  info.height = transposes(h.orientation) ? h.width : h.height;
  info.channels = h.components;
  info.orientation = h.orientation;
  info.encoding = Encoding::kJpeg;
  return info;
}

DecodedImage decode_jpeg(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& options) {
  JpegHeader h = read_jpeg_header(data, size, name);
  if (!options.exif_orientation) h.orientation = 1;
  const int o = h.orientation;
  const bool t = transposes(o);
  const int display_w = t ? h.height : h.width, display_h = t ? h.width : h.height;
  DecodedImage result;
  result.region = resolve_region(options.region, display_w, display_h, name);
  const Rect& r = result.region;

  // Everything below is in scaled pixels: the display rectangle, then the stored one it shows.
  const int m = options.dct_scaling ? choose_scale(r, display_w, display_h, options.min_width, options.min_height) : 8;
  const Span dx = scaled_span(r.x, r.width, display_w, m), dy = scaled_span(r.y, r.height, display_h, m);
  const int64_t scaled_w = (int64_t(h.width) * m + 7) / 8, scaled_h = (int64_t(h.height) * m + 7) / 8;
  Span sx = t ? dy : dx, sy = t ? dx : dy;
  if (flips_stored_x(o)) sx = flip(sx, scaled_w);
  if (flips_stored_y(o)) sy = flip(sy, scaled_h);

  result.width = int(dx.size());
  result.height = int(dy.size());
  std::vector<uint8_t> stored;
  JpegDecodeJob job{};
  job.data = data;
  job.size = size;
  job.scale = m;
  job.fast = options.fast;
  job.scaled_width = int(scaled_w);
  job.scaled_height = int(scaled_h);
  job.x = int(sx.begin);
  job.y = int(sy.begin);
  job.width = int(sx.size());
  job.height = int(sy.size());
  job.cmyk = h.color_space == JCS_CMYK || h.color_space == JCS_YCCK;
  job.adobe = h.adobe;
  const bool in_place = options.padded_rows && o == 1 && !job.cmyk;
  if (in_place) {
    if (options.recycle != nullptr) result.pixels.swap(*options.recycle);
    job.padded = &result.pixels;
  } else {
    stored.resize(size_t(sx.size()) * size_t(sy.size()) * 3);
    job.out = stored.data();
  }
  auto s = std::make_unique<JpegDecompress>();
  if (!run_guarded(s.get(), jpeg_decode_body, &job)) throw_jpeg(name, s->err);
  if (in_place) {
    result.offset = job.offset;
    result.row_stride = job.row_stride;
    return result;
  }

  if (o == 1) {
    result.pixels = std::move(stored);
  } else {
    result.pixels.resize(stored.size());
    apply_orientation(stored.data(), job.width, job.height, o, result.pixels.data());
  }
  return result;
}

// ---- PNG --------------------------------------------------------------------------------------

using SpngCtx = std::unique_ptr<spng_ctx, void (*)(spng_ctx*)>;

[[noreturn]] void throw_png(const std::string& name, int ret) {
  if (ret == SPNG_IO_EOF || ret == SPNG_IO_ERROR) throw bad_input("{}: truncated PNG ({})", name, spng_strerror(ret));
  if (ret == SPNG_EUSER_WIDTH || ret == SPNG_EUSER_HEIGHT)
    throw bad_input("{}: PNG image over the limit of {} pixels a side", name, kMaxSide);
  throw bad_input("{}: corrupt PNG data: {}", name, spng_strerror(ret));
}

SpngCtx open_png(const uint8_t* data, size_t size, const std::string& name, spng_ihdr* ihdr) {
  SpngCtx ctx(spng_ctx_new(0), spng_ctx_free);
  if (!ctx) throw runtime_error("{}: out of memory creating a PNG decoder", name);
  int ret = spng_set_image_limits(ctx.get(), kMaxSide, kMaxSide);
  // No chunk can be longer than the file; cached ancillary chunks are bounded on their own.
  if (ret == 0) ret = spng_set_chunk_limits(ctx.get(), std::min<size_t>(size, INT32_MAX), kPngCacheLimit);
  if (ret == 0) ret = spng_set_png_buffer(ctx.get(), data, size);
  if (ret == 0) ret = spng_get_ihdr(ctx.get(), ihdr);
  if (ret != 0) throw_png(name, ret);
  check_pixels(name, "PNG", ihdr->width, ihdr->height);
  return ctx;
}

int png_channels(const spng_ihdr& h) {
  switch (h.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
      return 1;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      return 2;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      return 4;
    default:
      return 3;  // truecolor, indexed
  }
}

ImageInfo probe_png(const uint8_t* data, size_t size, const std::string& name) {
  spng_ihdr ihdr{};
  SpngCtx ctx = open_png(data, size, name, &ihdr);
  ImageInfo info;
  info.width = int(ihdr.width);
  info.height = int(ihdr.height);
  info.channels = png_channels(ihdr);
  info.encoding = Encoding::kPng;
  return info;
}

// D3: libspng turns gray, palette, 16-bit and alpha into RGB8 (alpha dropped, not composited).
DecodedImage decode_png(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& options) {
  spng_ihdr ihdr{};
  SpngCtx ctx = open_png(data, size, name, &ihdr);
  const int width = int(ihdr.width), height = int(ihdr.height);
  DecodedImage result;
  result.region = resolve_region(options.region, width, height, name);
  const Rect& r = result.region;
  result.width = r.width;
  result.height = r.height;
  result.pixels.resize(size_t(r.width) * r.height * 3);
  const size_t row_bytes = size_t(width) * 3;

  if (ihdr.interlace_method != SPNG_INTERLACE_NONE) {
    // Adam7 passes cover the whole image: decode it all, then copy the region.
    size_t bytes = 0;
    int ret = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &bytes);
    if (ret != 0) throw_png(name, ret);
    if (bytes != row_bytes * height) throw bad_input("{}: corrupt PNG data: unexpected decoded size", name);
    std::vector<uint8_t> full(bytes);
    ret = spng_decode_image(ctx.get(), full.data(), full.size(), SPNG_FMT_RGB8, SPNG_DECODE_TRNS);
    if (ret != 0) throw_png(name, ret);
    copy_region_rgb(full.data(), width, 3, r, result.pixels.data());
    return result;
  }
  // Rows one at a time, stopping after the region's last row (D2).
  int ret = spng_decode_image(ctx.get(), nullptr, 0, SPNG_FMT_RGB8, SPNG_DECODE_TRNS | SPNG_DECODE_PROGRESSIVE);
  if (ret != 0) throw_png(name, ret);
  std::vector<uint8_t> row(row_bytes);
  for (int y = 0; y < r.y + r.height; ++y) {
    ret = spng_decode_row(ctx.get(), row.data(), row.size());
    if (ret != 0 && !(ret == SPNG_EOI && y == height - 1)) throw_png(name, ret);
    if (y >= r.y)
      std::memcpy(result.pixels.data() + size_t(y - r.y) * r.width * 3, row.data() + size_t(r.x) * 3,
                  size_t(r.width) * 3);
  }
  return result;
}

// ---- raw --------------------------------------------------------------------------------------

struct RawHeader {
  int width = 0, height = 0, channels = 0;
};

RawHeader read_raw_header(const uint8_t* data, size_t size, const std::string& name) {
  if (size < kRawHeaderBytes)
    throw bad_input("{}: truncated raw image header ({} of {} bytes)", name, size, kRawHeaderBytes);
  const uint32_t h = load_le32(data + 4), w = load_le32(data + 8), c = load_le32(data + 12);
  if (c != 1 && c != 3) throw bad_input("{}: unsupported raw image with {} channels (expected 1 or 3)", name, c);
  check_pixels(name, "raw", w, h);
  const uint64_t expect = kRawHeaderBytes + uint64_t(h) * w * c;
  if (size != expect)
    throw bad_input("{}: {} raw image: {} bytes, expected {} for {}x{}x{}", name,
                    size < expect ? "truncated" : "oversized", size, expect, h, w, c);
  return {int(w), int(h), int(c)};
}

DecodedImage decode_raw(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& options) {
  const RawHeader h = read_raw_header(data, size, name);
  DecodedImage result;
  result.region = resolve_region(options.region, h.width, h.height, name);
  result.width = result.region.width;
  result.height = result.region.height;
  result.pixels.resize(size_t(result.width) * result.height * 3);
  copy_region_rgb(data + kRawHeaderBytes, h.width, h.channels, result.region, result.pixels.data());
  return result;
}

[[noreturn]] void throw_unknown(const uint8_t* data, size_t size, const std::string& name) {
  if (size == 0) throw bad_input("{}: empty file, not an image", name);
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) start += fmt::format("{}{:02x}", i ? " " : "", data[i]);
  throw bad_input("{}: unsupported image format: not JPEG, PNG or raw CRWP (starts with {})", name, start);
}

}  // namespace

Encoding detect_encoding(const uint8_t* data, size_t size) {
  if (data == nullptr) return Encoding::kUnknown;
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return Encoding::kJpeg;
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return Encoding::kPng;
  if (size >= 4 && std::memcmp(data, kRawMagic, 4) == 0) return Encoding::kRaw;
  return Encoding::kUnknown;
}

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::kJpeg:
      return "jpeg";
    case Encoding::kPng:
      return "png";
    case Encoding::kRaw:
      return "raw";
    case Encoding::kUnknown:
      break;
  }
  return "unknown";
}

ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& name, bool exif_orientation) {
  switch (detect_encoding(data, size)) {
    case Encoding::kJpeg:
      return probe_jpeg(data, size, name, exif_orientation);
    case Encoding::kPng:
      return probe_png(data, size, name);
    case Encoding::kRaw: {
      const RawHeader h = read_raw_header(data, size, name);
      ImageInfo info;
      info.width = h.width;
      info.height = h.height;
      info.channels = h.channels;
      info.encoding = Encoding::kRaw;
      return info;
    }
    case Encoding::kUnknown:
      break;
  }
  throw_unknown(data, size, name);
}

DecodedImage decode_image(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& options) {
  switch (detect_encoding(data, size)) {
    case Encoding::kJpeg:
      return decode_jpeg(data, size, name, options);
    case Encoding::kPng:
      return decode_png(data, size, name, options);
    case Encoding::kRaw:
      return decode_raw(data, size, name, options);
    case Encoding::kUnknown:
      break;
  }
  throw_unknown(data, size, name);
}

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality) {
  if (width <= 0 || height <= 0 || width > 65500 || height > 65500)
    throw bad_input("encode_jpeg: cannot encode a {}x{} image (JPEG allows 1..65500 a side)", width, height);
  if (quality < 1 || quality > 100) throw bad_input("encode_jpeg: quality {} outside 1..100", quality);
  // Worst case for 4:2:0 (TurboJPEG's tjBufSize): 3 bytes a pixel of the MCU-padded image plus
  // headers, so libjpeg never has to grow (and malloc) the buffer itself.
  const size_t padded = size_t((width + 15) / 16 * 16) * size_t((height + 15) / 16 * 16);
  std::vector<uint8_t> buffer(padded * 3 + 2048);
  JpegEncodeJob job{};
  job.rgb = rgb;
  job.width = width;
  job.height = height;
  job.quality = quality;
  job.out = buffer.data();
  job.out_size = static_cast<unsigned long>(buffer.size());
  auto s = std::make_unique<JpegCompress>();
  const bool ok = run_guarded(s.get(), jpeg_encode_body, &job);
  if (ok && job.out == buffer.data()) {
    buffer.resize(job.out_size);
    return buffer;
  }
  if (ok) {  // libjpeg outgrew our buffer after all and malloc'd its own
    std::vector<uint8_t> grown(job.out, job.out + job.out_size);
    std::free(job.out);
    return grown;
  }
  throw runtime_error("encode_jpeg: libjpeg failed: {}", s->err.message);
}

}  // namespace crucible::data
