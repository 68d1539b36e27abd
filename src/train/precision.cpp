// Precision: parse and print (see precision.h).
#include "crucible/train/precision.h"

#include "crucible/core/error.h"

namespace crucible::train {
namespace {

ComputeDtype parse_dtype(const std::string& text, const std::string& source) {
  if (text == "fp32") return ComputeDtype::kFp32;
  if (text == "bf16") return ComputeDtype::kBf16;
  if (text == "fp16") return ComputeDtype::kFp16;
  throw bad_input("{}: precision \"{}\" is none of fp32, bf16, fp16", source, text);
}

bool parse_memory_format(const std::string& text, const std::string& source) {
  if (text == "channels_last") return true;
  if (text == "contiguous") return false;
  throw bad_input("{}: memory format \"{}\" is neither contiguous nor channels_last", source, text);
}

}  // namespace

std::string Precision::dtype_name() const {
  switch (dtype) {
    case ComputeDtype::kBf16:
      return "bf16";
    case ComputeDtype::kFp16:
      return "fp16";
    case ComputeDtype::kFp32:
      break;
  }
  return "fp32";
}

std::string Precision::memory_format_name() const { return channels_last ? "channels_last" : "contiguous"; }

std::string Precision::to_string() const { return dtype_name() + " " + memory_format_name(); }

Precision Precision::parse(const std::string& text, const std::string& source) {
  const size_t space = text.find(' ');
  if (space == std::string::npos) {
    throw bad_input("{}: \"{}\" is not \"<precision> <memory format>\"", source, text);
  }
  return from_fields(text.substr(0, space), text.substr(space + 1), source);
}

Precision Precision::from_fields(const std::string& dtype, const std::string& memory_format,
                                 const std::string& source) {
  return Precision{parse_dtype(dtype, source), parse_memory_format(memory_format, source)};
}

Precision configured_precision(PrecisionMode mode, bool channels_last) {
  switch (mode) {
    case PrecisionMode::kBf16:
      return {ComputeDtype::kBf16, channels_last};
    case PrecisionMode::kFp16:
      return {ComputeDtype::kFp16, channels_last};
    case PrecisionMode::kFp32:
    case PrecisionMode::kAuto:
      break;
  }
  return {ComputeDtype::kFp32, channels_last};
}

Precision cpu_auto_precision(bool native_bf16, bool channels_last) {
  return {native_bf16 ? ComputeDtype::kBf16 : ComputeDtype::kFp32, channels_last};
}

std::vector<std::pair<std::string, PrecisionMode>> precision_mode_names() {
  return {{"fp32", PrecisionMode::kFp32},
          {"bf16", PrecisionMode::kBf16},
          {"fp16", PrecisionMode::kFp16},
          {"auto", PrecisionMode::kAuto}};
}

}  // namespace crucible::train
