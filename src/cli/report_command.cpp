// report.
#include "report_command.h"

#include <cstdio>

#include <CLI/CLI.hpp>

#include "crucible/core/config.h"
#include "crucible/core/file.h"
#include "crucible/obs/report.h"
#include "crucible/train/job_config.h"

namespace crucible {
extern const char* const kDefaultConfigToml;  // configs/fashion_mnist.toml, embedded at build time
}

namespace crucible::cli {

std::string default_job_toml() {
  // Resolved through the schema so that keys the file leaves at their defaults are compared too.
  return train::resolve_job_toml(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)");
}

CLI::App* add_report(CLI::App& app, ReportArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "report",
      "render a run folder as one self-contained HTML page (curves, step-time breakdown and bottleneck, "
      "config against the default job, environment, checkpoints); several runs: one comparison page");
  cmd->add_option("runs", a.runs, "run folders (run.dir/run.name)")->required();
  cmd->add_option("--out", a.out,
                  "the page to write (default: RUN/report.html for one run, report-compare.html for several)");
  cmd->footer(
      "\nExamples: crucible report runs/fashion_mnist\n"
      "          crucible report runs/a runs/b --out a-vs-b.html");
  return cmd;
}

int run_report(const ReportArgs& a) {
  const std::string defaults = default_job_toml();
  if (a.runs.size() == 1 && a.out.empty()) {
    std::printf("%s\n", obs::write_run_report(a.runs.front(), defaults).c_str());
    return 0;
  }
  std::vector<obs::RunReportData> runs;
  for (const auto& r : a.runs) runs.push_back(obs::load_run_report_data(r));
  const std::string out = a.out.empty() ? std::string("report-compare.html") : a.out;
  write_file_atomic(out, obs::render_report(runs, defaults));
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace crucible::cli
