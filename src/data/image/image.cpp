// Names and parsing for the image conventions.
#include "crucible/data/image/image.h"

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::data {

const char* color_order_name(ColorOrder o) {
  switch (o) {
    case ColorOrder::kGray:
      return "gray";
    case ColorOrder::kRGB:
      return "RGB";
    case ColorOrder::kBGR:
      return "BGR";
  }
  return "?";
}

const char* value_range_name(ValueRange r) {
  switch (r) {
    case ValueRange::kByte:
      return "0-255";
    case ValueRange::kUnit:
      return "0-1";
    case ValueRange::kNormalized:
      return "normalized";
  }
  return "?";
}

ValueRange parse_value_range(const std::string& text, const std::string& key) {
  if (text == "unit") return ValueRange::kUnit;
  if (text == "byte") return ValueRange::kByte;
  throw bad_input("{}: expected \"unit\" (values in 0-1) or \"byte\" (values in 0-255), found \"{}\"", key, text);
}

ColorOrder parse_color_order(const std::string& text, const std::string& key) {
  if (text == "RGB") return ColorOrder::kRGB;
  if (text == "BGR") return ColorOrder::kBGR;
  throw bad_input("{}: expected \"RGB\" or \"BGR\", found \"{}\"", key, text);
}

std::string ImageSpec::to_string() const {
  if (type == SampleType::kFeatures) {
    return fmt::format("{}x{}x{} (channels x height x width) float32 features, used as they are", channels, height,
                       width);
  }
  return fmt::format("{}x{}x{} {} uint8 {}", height, width, channels, color_order_name(order), value_range_name(range));
}

}  // namespace crucible::data
