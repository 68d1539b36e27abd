// What `crucible preview` and a detector's evaluation images draw with, torch-free: text in a
// hand-written 3×5 bitmap font (digits, letters, a few signs: no font package is worth a
// dependency for tile captions), rectangles, a colour per class, and the PNG (libspng) with one
// tEXt chunk of JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible::obs {

// Draws `text` at (x, y) of an RGB image `width` pixels wide in `rgb` colour, each font pixel
// `scale` × `scale`; letters are drawn upper-case, characters without a glyph as a space, and
// characters past `max_x` are left out. Returns the x after the last character drawn.
int64_t draw_text(std::vector<uint8_t>& rgb, int64_t width, int64_t x, int64_t y, const std::string& text, int scale,
                  int64_t max_x, const uint8_t colour[3] = nullptr);

// The outline of the rectangle [x1, x2) × [y1, y2), `thickness` pixels inside it, clipped to the
// image (`width` × `height`).
void draw_rect(std::vector<uint8_t>& rgb, int64_t width, int64_t height, int64_t x1, int64_t y1, int64_t x2,
               int64_t y2, int thickness, const uint8_t colour[3]);

// A filled rectangle, clipped.
void fill_rect(std::vector<uint8_t>& rgb, int64_t width, int64_t height, int64_t x1, int64_t y1, int64_t x2,
               int64_t y2, const uint8_t colour[3]);

// A colour per class (label), apart from each other and from grey.
void class_colour(int64_t label, uint8_t out[3]);

// The PNG of `rgb` ([height, width, 3]) with a tEXt chunk `keyword` holding `json`.
std::string encode_png(const std::vector<uint8_t>& rgb, int64_t width, int64_t height, const std::string& keyword,
                       const std::string& json);

}  // namespace crucible::obs
