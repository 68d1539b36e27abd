// Conventions carried as data (law 3): an image states its channel order (D3) and the range
// of its values (D4), so a transform or model that expects otherwise fails at start-up.
#pragma once

#include <cstdint>
#include <string>

namespace crucible::data {

enum class ColorOrder : uint8_t { kGray, kRGB, kBGR };
enum class ValueRange : uint8_t {
  kByte,        // 0–255 (uint8 pixels, or floats not yet divided by 255)
  kUnit,        // 0–1
  kNormalized,  // after (x - mean) / std
};

const char* color_order_name(ColorOrder o);
const char* value_range_name(ValueRange r);
// Parses "byte" / "unit" (config spelling) or throws bad_input naming `key`.
ValueRange parse_value_range(const std::string& text, const std::string& key);

// Parses "RGB" / "BGR" or throws bad_input naming `key`.
ColorOrder parse_color_order(const std::string& text, const std::string& key);

// Shape and conventions of a fixed-size image sample: pixels are [height, width, channels] uint8.
struct ImageSpec {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  ColorOrder order = ColorOrder::kGray;
  ValueRange range = ValueRange::kByte;

  int64_t bytes() const { return height * width * channels; }
  std::string to_string() const;
};

}  // namespace crucible::data
