// inspect / convert over io::inspect_tensors, io::read_tensors and io::convert_tensors.
#include "io_commands.h"

#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/io/raw.h"
#include "crucible/io/tensor_file.h"

namespace crucible::cli {
namespace {

void add_text_options(CLI::App* cmd, IoArgs& a) {
  cmd->add_option("--delimiter", a.delimiter, "text: column separator (default: whitespace; ',' for .csv output)");
  cmd->add_option("--comments", a.comments, "text: comment prefix (default '#')");
  cmd->add_option("--skip-rows", a.skip_rows, "text: lines to skip at the start")->check(CLI::NonNegativeNumber);
  cmd->add_option("--usecols", a.usecols, "text: columns to read, e.g. 0,2,-1");
  cmd->add_option("--fmt", a.fmt, "text output: printf format of one number (default %.18e, as numpy.savetxt)");
}

void add_raw_options(CLI::App* cmd, IoArgs& a) {
  cmd->add_option("--dtype", a.dtype, "raw input: element type (float32, uint8, int64, <f4, …)");
  cmd->add_option("--shape", a.shape, "raw input: shape, one dimension may be -1 (e.g. -1,4)");
}

void add_budget_option(CLI::App* cmd, IoArgs& a) {
  cmd->add_option("--memory-budget-mb", a.memory_budget_mb,
                  fmt::format("most MiB one read may inflate from compressed members (npz, gzip IDX), checked before "
                              "inflating (default: half the physical memory, {} MiB here)",
                              default_memory_budget() >> 20))
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
}

io::ReadOptions read_options(const IoArgs& a) {
  io::ReadOptions o;
  o.memory_budget = a.memory_budget_mb << 20;
  if (!a.dtype.empty() || !a.shape.empty()) {
    if (a.dtype.empty()) throw bad_input("{}: --shape needs --dtype (a raw file has no header to say it)", a.input);
    io::RawSpec spec;
    if (!io::dtype_from_name(a.dtype, &spec.dtype)) {
      throw bad_input("--dtype {}: unknown type (bool, int8…int64, uint8…uint64, float16, bfloat16, float32, float64, "
                      "complex64, complex128, or NumPy codes such as <f4)",
                      a.dtype);
    }
    spec.shape = io::parse_shape(a.shape, "--shape");
    o.raw = spec;
  }
  o.text.delimiter = a.delimiter;
  o.text.comments = a.comments;
  o.text.skip_rows = a.skip_rows;
  if (!a.usecols.empty()) o.text.use_cols = io::parse_shape(a.usecols, "--usecols");
  return o;
}

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.6g}", v);
}

}  // namespace

CLI::App* add_inspect(CLI::App& app, IoArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "inspect", "show what an array file holds: format (from its content), names, dtypes, shapes, sizes");
  cmd->add_option("file", a.input, "npy, npz, safetensors, PyTorch .pt, IDX (gzip or plain), text, or raw")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", a.json, "print one JSON object");
  cmd->add_flag("--stats", a.stats, "also min, max, mean and NaN/Inf counts of every array (reads the data)");
  add_budget_option(cmd, a);
  add_raw_options(cmd, a);
  add_text_options(cmd, a);
  return cmd;
}

CLI::App* add_convert(CLI::App& app, IoArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "convert between npy, npz, safetensors, raw and text (and read .pt and IDX); format of OUT from its "
                 "extension");
  cmd->add_option("input", a.input, "input file (format detected from its content)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("output", a.output, "output: .npy .npz .safetensors .bin/.raw .txt/.csv")->required();
  cmd->add_option("--name", a.name, "keep only the array with this name");
  cmd->add_flag("--compress", a.compress, "npz output: deflate members (numpy.savez_compressed)");
  add_budget_option(cmd, a);
  add_raw_options(cmd, a);
  add_text_options(cmd, a);
  return cmd;
}

int run_inspect(const IoArgs& a) {
  // Without --stats only headers are read: an npz member is never inflated (issue 10).
  io::TensorSet set;
  io::TensorSetInfo info;
  if (a.stats) {
    set = io::read_tensors(a.input, read_options(a));
    info = io::describe_tensors(set);
  } else {
    info = io::inspect_tensors(a.input, read_options(a));
  }
  nlohmann::ordered_json j;
  j["file"] = a.input;
  j["format"] = io::format_name(info.format);
  j["arrays"] = nlohmann::ordered_json::array();
  uint64_t total = 0;
  std::string table;
  for (size_t i = 0; i < info.arrays.size(); ++i) {
    const io::ArrayInfo& arr = info.arrays[i];
    total += arr.nbytes;
    nlohmann::ordered_json e = {{"name", arr.name},
                                {"dtype", io::dtype_name(arr.dtype)},
                                {"shape", arr.shape},
                                {"nbytes", arr.nbytes}};
    std::string line = fmt::format("  {:<40} {:<11} {:<20} {:>12}", arr.name, io::dtype_name(arr.dtype),
                                   arr.shape_string(), arr.nbytes);
    if (a.stats) {
      if (io::dtype_is_complex(arr.dtype)) {
        e["stats"] = nullptr;
        line += "  (complex: no stats)";
      } else {
        const io::ArrayStats s = io::array_stats(set.arrays[i].array, a.input + ":" + arr.name);
        e["stats"] = {{"min", std::isnan(s.min) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.min)},
                      {"max", std::isnan(s.max) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.max)},
                      {"mean", std::isnan(s.mean) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.mean)},
                      {"nan", s.nan},
                      {"inf", s.inf}};
        line += fmt::format("  min {} max {} mean {} nan {} inf {}", number(s.min), number(s.max), number(s.mean),
                            s.nan, s.inf);
      }
    }
    j["arrays"].push_back(e);
    table += line + "\n";
  }
  j["nbytes"] = total;
  j["metadata"] = info.metadata;
  j["skipped"] = info.skipped;
  j["notes"] = info.notes;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s: %s, %zu array(s), %llu bytes of data\n", a.input.c_str(), io::format_name(info.format),
              info.arrays.size(), static_cast<unsigned long long>(total));
  if (!info.arrays.empty()) {
    std::printf("  %-40s %-11s %-20s %12s%s\n", "name", "dtype", "shape", "bytes", a.stats ? "  stats" : "");
    std::fputs(table.c_str(), stdout);
  }
  for (const auto& [k, v] : info.metadata) std::printf("metadata: %s = %s\n", k.c_str(), v.c_str());
  for (const auto& s : info.skipped) std::printf("not an array: %s\n", s.c_str());
  for (const auto& n : info.notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

int run_convert(const IoArgs& a) {
  io::ReadOptions r = read_options(a);
  r.name = a.name;
  const io::Format out = io::format_for_extension(a.output);
  io::WriteOptions w;
  w.compress = a.compress;
  w.text.delimiter = a.delimiter;
  if (w.text.delimiter.empty() && a.output.size() >= 4 && a.output.compare(a.output.size() - 4, 4, ".csv") == 0) {
    w.text.delimiter = ",";
  }
  w.text.fmt = a.fmt;
  const io::TensorSetInfo set = io::convert_tensors(a.input, a.output, out, r, w);
  for (const auto& s : set.skipped) log_info("skipped (not an array): {}", s);
  for (const auto& n : set.notes) log_info("note: {}", n);
  log_info("{} ({}) → {} ({}): {} array(s)", a.input, io::format_name(set.format), a.output, io::format_name(out),
           set.arrays.size());
  return 0;
}

}  // namespace crucible::cli
