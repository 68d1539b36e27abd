// Conventions carried as data (law 3): an image states its channel order (D3), the range of
// its values (D4) and whether it is uint8 pixels or float features the model takes as they are,
// so a transform or model that expects otherwise fails at start-up.
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

// What a sample's values are: uint8 pixels (normalised on the device with data.mean/data.std,
// augmented as images), or float features (data.dataset = "arrays") that reach the model as
// they are: no normalisation, no flip.
enum class SampleType : uint8_t {
  kPixels,    // [height, width, channels] uint8, 0-255
  kFeatures,  // [channels, height, width] float32, range kNormalized (model-ready as stored)
};

// Shape and conventions of a fixed-size sample: uint8 pixels [height, width, channels], or
// float32 features [channels, height, width] (type kFeatures).
struct ImageSpec {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  ColorOrder order = ColorOrder::kGray;
  ValueRange range = ValueRange::kByte;
  SampleType type = SampleType::kPixels;

  int64_t element_bytes() const { return type == SampleType::kFeatures ? 4 : 1; }
  int64_t bytes() const { return height * width * channels * element_bytes(); }
  std::string to_string() const;
};

}  // namespace crucible::data
