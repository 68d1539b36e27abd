// Precision: the typed choice of compute precision × memory format a run trains in, with
// parse and print (checkpoints, the broadcast of an `auto` choice, logs). `train.precision`
// is a PrecisionMode from parsing onwards. Torch-free; the autocast mapping is in torch code.
#pragma once

#include <string>
#include <vector>

namespace crucible::train {

// train.precision as configured.
enum class PrecisionMode { kFp32, kBf16, kFp16, kAuto };

// What the forward pass computes in: fp32, or autocast mixed precision in bf16 / fp16.
enum class ComputeDtype { kFp32, kBf16, kFp16 };

struct Precision {
  ComputeDtype dtype = ComputeDtype::kFp32;
  bool channels_last = false;

  bool mixed() const { return dtype != ComputeDtype::kFp32; }
  std::string dtype_name() const;          // "fp32" | "bf16" | "fp16"
  std::string memory_format_name() const;  // "contiguous" | "channels_last"
  std::string to_string() const;           // "bf16 channels_last"
  // Reads to_string()'s form; throws bad_input naming `source`.
  static Precision parse(const std::string& text, const std::string& source);
  // From the two checkpoint fields ("bf16", "channels_last"); throws bad_input naming `source`.
  static Precision from_fields(const std::string& dtype, const std::string& memory_format, const std::string& source);

  bool operator==(const Precision& o) const { return dtype == o.dtype && channels_last == o.channels_last; }
  bool operator!=(const Precision& o) const { return !(*this == o); }
};

// How the run's precision and memory format were decided (`train.precision`).
struct PrecisionTiming {
  Precision precision;  // fp32 | bf16, either memory format
  double ms = 0;        // best time of one whole training step on a batch
};
struct PrecisionChoice {
  Precision value;
  std::string source;           // "configured" | "auto" (timed here) | "checkpoint" (a resumed run's)
  std::vector<PrecisionTiming> timed;  // "auto": every candidate, in the order timed
};

// The configured precision for a mode other than auto (fp32 / bf16 / fp16).
Precision configured_precision(PrecisionMode mode, bool channels_last);

// `auto` on a CPU, by rule rather than by timing: bf16 autocast where the CPU computes bf16 in
// hardware, else fp32 (emulated bf16 runs 8-30x slower than fp32: measured in BENCHMARKS.md);
// the memory format as configured. A rule gives every run on a machine the same choice, and
// so the same results; timing a step of each candidate costs minutes where bf16 is emulated.
Precision cpu_auto_precision(bool native_bf16, bool channels_last);

// (spelling, value) of every PrecisionMode, for the config schema.
std::vector<std::pair<std::string, PrecisionMode>> precision_mode_names();

}  // namespace crucible::train
