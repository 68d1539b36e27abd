// obs/draw.h: the 3×5 font, rectangles, a colour per class, the PNG.
#include "crucible/obs/draw.h"

#include <spng.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

namespace crucible::obs {
namespace {

// 3×5 glyphs, one row per 3 bits (bit 2 = left).
constexpr std::array<std::array<uint8_t, 5>, 10> kDigits = {{
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1}, {7, 4, 7, 1, 7},
    {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7},
}};
constexpr std::array<std::array<uint8_t, 5>, 26> kLetters = {{
    {2, 5, 7, 5, 5}, {6, 5, 6, 5, 6}, {3, 4, 4, 4, 3}, {6, 5, 5, 5, 6}, {7, 4, 6, 4, 7}, {7, 4, 6, 4, 4},
    {3, 4, 5, 5, 3}, {5, 5, 7, 5, 5}, {7, 2, 2, 2, 7}, {1, 1, 1, 5, 2}, {5, 5, 6, 5, 5}, {4, 4, 4, 4, 7},
    {5, 7, 7, 5, 5}, {6, 5, 5, 5, 5}, {2, 5, 5, 5, 2}, {6, 5, 6, 4, 4}, {2, 5, 5, 6, 3}, {6, 5, 6, 5, 5},
    {3, 4, 2, 1, 6}, {7, 2, 2, 2, 2}, {5, 5, 5, 5, 7}, {5, 5, 5, 5, 2}, {5, 5, 7, 7, 5}, {5, 5, 2, 5, 5},
    {5, 5, 2, 2, 2}, {7, 1, 2, 4, 7},
}};

std::array<uint8_t, 5> glyph(char ch) {
  if (ch >= '0' && ch <= '9') return kDigits[static_cast<size_t>(ch - '0')];
  if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  if (ch >= 'A' && ch <= 'Z') return kLetters[static_cast<size_t>(ch - 'A')];
  switch (ch) {
    case '+': return {0, 2, 7, 2, 0};
    case '-': return {0, 0, 7, 0, 0};
    case '_': return {0, 0, 0, 0, 7};
    case '.': return {0, 0, 0, 0, 2};
    case ':': return {0, 2, 0, 2, 0};
    default: return {0, 0, 0, 0, 0};
  }
}

}  // namespace

int64_t draw_text(std::vector<uint8_t>& rgb, int64_t width, int64_t x, int64_t y, const std::string& text, int scale,
                  int64_t max_x, const uint8_t colour[3]) {
  static const uint8_t kWhite[3] = {255, 255, 255};
  if (colour == nullptr) colour = kWhite;
  for (char ch : text) {
    if (x + 3 * scale > max_x) break;
    const std::array<uint8_t, 5> g = glyph(ch);
    for (int row = 0; row < 5; ++row) {
      for (int col = 0; col < 3; ++col) {
        if (((g[static_cast<size_t>(row)] >> (2 - col)) & 1) == 0) continue;
        for (int dy = 0; dy < scale; ++dy) {
          for (int dx = 0; dx < scale; ++dx) {
            const size_t at = static_cast<size_t>(((y + row * scale + dy) * width + x + col * scale + dx) * 3);
            if (at + 2 >= rgb.size()) continue;
            rgb[at] = colour[0], rgb[at + 1] = colour[1], rgb[at + 2] = colour[2];
          }
        }
      }
    }
    x += 4 * scale;
  }
  return x;
}

void fill_rect(std::vector<uint8_t>& rgb, int64_t width, int64_t height, int64_t x1, int64_t y1, int64_t x2,
               int64_t y2, const uint8_t colour[3]) {
  x1 = std::max<int64_t>(x1, 0), y1 = std::max<int64_t>(y1, 0);
  x2 = std::min(x2, width), y2 = std::min(y2, height);
  for (int64_t y = y1; y < y2; ++y) {
    for (int64_t x = x1; x < x2; ++x) {
      uint8_t* p = rgb.data() + (y * width + x) * 3;
      p[0] = colour[0], p[1] = colour[1], p[2] = colour[2];
    }
  }
}

void draw_rect(std::vector<uint8_t>& rgb, int64_t width, int64_t height, int64_t x1, int64_t y1, int64_t x2,
               int64_t y2, int thickness, const uint8_t colour[3]) {
  const int64_t t = thickness;
  fill_rect(rgb, width, height, x1, y1, x2, std::min(y1 + t, y2), colour);
  fill_rect(rgb, width, height, x1, std::max(y2 - t, y1), x2, y2, colour);
  fill_rect(rgb, width, height, x1, y1, std::min(x1 + t, x2), y2, colour);
  fill_rect(rgb, width, height, std::max(x2 - t, x1), y1, x2, y2, colour);
}

void class_colour(int64_t label, uint8_t out[3]) {
  static const uint8_t kPalette[][3] = {{255, 64, 64},  {64, 220, 64},  {64, 128, 255}, {255, 200, 0},
                                        {255, 64, 255}, {0, 230, 230},  {255, 140, 0},  {160, 96, 255},
                                        {128, 255, 128}, {255, 128, 160}};
  const auto& c = kPalette[static_cast<size_t>(label) % (sizeof kPalette / sizeof kPalette[0])];
  out[0] = c[0], out[1] = c[1], out[2] = c[2];
}

std::string encode_png(const std::vector<uint8_t>& rgb, int64_t width, int64_t height, const std::string& keyword,
                       const std::string& json) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  if (!ctx) throw std::runtime_error("preview: libspng could not make an encoder");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx.get(), &ihdr);
  spng_text text{};
  std::snprintf(text.keyword, sizeof(text.keyword), "%s", keyword.c_str());
  text.type = SPNG_TEXT;
  text.length = json.size();
  std::string body = json;
  text.text = body.data();
  spng_set_text(ctx.get(), &text, 1);
  if (int e = spng_encode_image(ctx.get(), rgb.data(), rgb.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE); e != 0) {
    throw std::runtime_error(fmt::format("preview: PNG encoding failed: {}", spng_strerror(e)));
  }
  size_t size = 0;
  int e = 0;
  void* buf = spng_get_png_buffer(ctx.get(), &size, &e);
  if (buf == nullptr) throw std::runtime_error(fmt::format("preview: PNG encoding failed: {}", spng_strerror(e)));
  std::string png(static_cast<const char*>(buf), size);
  std::free(buf);
  return png;
}

}  // namespace crucible::obs
