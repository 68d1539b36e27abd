// The run report: one self-contained HTML page (inline CSS and SVG, no JavaScript, no URL) made
// from a run folder's metrics.jsonl, summary.json, config.toml and checkpoints/, so a run can be
// read, mailed and compared without a server. Several runs render as one comparison page.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace crucible::obs {

// What a report shows of one run folder, as read from its files. A value type; immutable once
// loaded (the JSON is shared, never modified).
struct RunReportData {
  std::string name;  // the folder's base name
  std::string dir;   // the folder as given
  // Every record of metrics.jsonl, in file order (a JSON array of objects; never null).
  std::shared_ptr<const nlohmann::ordered_json> records;
  // summary.json's object, key order kept; null while the run is in progress (no summary yet).
  std::shared_ptr<const nlohmann::ordered_json> summary;
  std::string config_toml;               // config.toml's text (the resolved job)
  std::vector<std::string> checkpoints;  // file names in <dir>/checkpoints/, sorted; no temp files
  bool torn_last_line = false;           // metrics.jsonl ended in a half-written line (skipped)
  std::string eval_images_png;           // a detector's eval_images.png (train/eval_images.h); empty if none
};

// Reads `run_dir`. Throws bad_input naming the file (and line) and what was expected when the
// folder, metrics.jsonl or config.toml is missing, a metrics line is not a JSON object, or
// summary.json / config.toml does not parse. A last metrics line without its newline that does
// not parse is a write in progress (or cut by a crash): skipped and flagged, not an error.
RunReportData load_run_report_data(const std::string& run_dir);

// The page: one run → that run's report; several → a comparison (overlaid curves, one colour
// per run, and the config keys that differ between them). `defaults_toml` is the default job's
// TOML; config keys whose values differ from it are marked (class="changed"). Throws bad_input
// when `defaults_toml` does not parse, or `runs` is empty.
std::string render_report(const std::vector<RunReportData>& runs, const std::string& defaults_toml);

// Loads `run_dir` and writes <run_dir>/report.html atomically; returns that path.
std::string write_run_report(const std::string& run_dir, const std::string& defaults_toml);

}  // namespace crucible::obs
