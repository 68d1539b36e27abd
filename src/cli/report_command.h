// `crucible report RUN [RUN…] [--out FILE]`: argument wiring over obs/report.h, which holds the
// logic. Torch-free, so it runs in the front program and starts in milliseconds.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crucible::cli {

struct ReportArgs {
  std::vector<std::string> runs;  // run folders (run.dir/run.name)
  std::string out;                // empty: <run>/report.html for one run, report-compare.html for several
};

CLI::App* add_report(CLI::App& app, ReportArgs& args);
int run_report(const ReportArgs& args);

// The default job (configs/fashion_mnist.toml, built in) with every key resolved, as TOML: what a
// report compares a run's config.toml against.
std::string default_job_toml();

}  // namespace crucible::cli
