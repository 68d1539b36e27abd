// The HTML run report: a run folder made here (7 train + 2 eval records, summary.json,
// config.toml, checkpoints/) renders to a page whose every series path has one M/L command per
// record that carries the value, with the verdict, the changed config keys, escaped text and no
// script or URL; two runs compare on one page; malformed files are bad input naming file and line.
// To add a case: build a folder with write_run() (change what you need), render, and look for it.
#include "crucible/obs/report.h"

#include <filesystem>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::obs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kDefaults = R"(
[run]
name = "fashion_mnist"
dir = "runs"
[data]
mean = [0.2860]
note = "plain"
[train]
batch_size = 256
lr = 0.002
precision = "bf16"
)";

// Writes a run folder `name` under `root`; returns its path.
std::string write_run(const test::TempDir& root, const std::string& name, double loss_shift = 0,
                      bool with_summary = true) {
  const std::string dir = root / name;
  fs::create_directories(dir + "/checkpoints");
  std::string lines;
  for (int i = 1; i <= 7; ++i) {
    json r = {{"type", "train"},
              {"step", 5 * i},
              {"epoch", 0},
              {"loss", 2.3 / i + loss_shift},
              {"acc", 0.1 * i},
              {"lr", 0.001 * i},
              {"samples_per_s", 1000 + 10 * i}};
    if (i == 4) r["lr"] = nullptr;  // a record without the value: skipped, not counted
    if (i >= 6) r["breakdown"] = {{"data_wait", 0.1}, {"forward", 0.4}, {"backward", 0.4}, {"other", 0.1}};
    if (i == 7) r["verdict"] = "compute-bound";
    lines += r.dump() + "\n";
    if (i == 3 || i == 7) {
      lines +=
          json({{"type", "eval"}, {"step", 5 * i}, {"test_loss", 0.9 / i}, {"test_acc", 0.5 + 0.05 * i}}).dump() + "\n";
    }
  }
  test::write_text(dir + "/metrics.jsonl", lines);
  test::write_text(dir + "/config.toml", "[run]\nname = \"" + name +
                                             "\"\ndir = \"runs\"\n[data]\nmean = [0.5]\n"
                                             "note = \"<script>alert('x')</script> & more\"\n[train]\nbatch_size = " +
                                             std::to_string(128 + static_cast<int>(loss_shift * 10)) +
                                             "\nlr = 0.002\nprecision = \"bf16\"\n");
  if (with_summary) {
    const json s = {
        {"test_acc", 0.85},
        {"test_loss", 0.4123456},
        {"steps", 35},
        {"samples_per_s", 1234.5678},
        {"params_sha256", "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12"},
        {"torch_version", "1.13.1"},
        {"crucible_version", "0.1.0"},
        {"threads", 2},
        {"world_size", 1},
        {"precision", "bf16"},
        {"memory_format", "channels_last"},
        {"host_reads_per_step", 0.2},
        {"bad_samples_skipped", 2},
        {"skipped_samples", {"train/17 <bad jpeg>", "train/99"}},
        {"bottleneck",
         {{"verdict", "compute-bound"},
          {"share", 0.83},
          {"evidence", "forward+backward 83% of step time"},
          {"fix", "a bigger batch or bf16"}}},
        {"breakdown",
         {{"step_seconds", 12.3},
          {"phases", {{"data_wait", 0.5}, {"forward", 5.0}, {"backward", 5.2}, {"optimizer", 1.0}, {"other", 0.6}}},
          {"checkpoint_eval_seconds", 2.0}}},
        {"environment", {{"cpu", "Xeon & co"}, {"OMP_NUM_THREADS", "2"}}},
        {"doctor",
         {{{"name", "threads"}, {"status", "ok"}, {"found", "2"}, {"fix", ""}},
          {{"name", "ulimit -n"}, {"status", "warn"}, {"found", "1024"}, {"fix", "ulimit -n 65536"}}}}};
    test::write_text(dir + "/summary.json", s.dump(2));
  }
  test::write_text(dir + "/checkpoints/step-00000035.ckpt", "x");
  test::write_text(dir + "/checkpoints/step-00000040.ckpt.tmp-123", "x");  // an unfinished write: not listed
  return dir;
}

struct PathTag {
  std::map<std::string, std::string> attrs;
  int commands = 0;  // M and L commands in d
};

// Every <path class="series" …> of the page, by attribute.
std::vector<PathTag> series_paths(const std::string& html) {
  std::vector<PathTag> out;
  const std::regex tag(R"(<path class="series"[^>]*>)"), attr(R"(([a-z-]+)="([^"]*)\")");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), tag); it != std::sregex_iterator(); ++it) {
    PathTag p;
    const std::string t = it->str();
    for (auto a = std::sregex_iterator(t.begin(), t.end(), attr); a != std::sregex_iterator(); ++a) {
      p.attrs[(*a)[1]] = (*a)[2];
    }
    for (char c : p.attrs["d"]) p.commands += (c == 'M' || c == 'L');
    out.push_back(std::move(p));
  }
  return out;
}

const std::map<std::string, int> kExpectedPoints = {{"train.loss", 7},     {"train.acc", 7},
                                                    {"train.lr", 6},       {"train.samples_per_s", 7},
                                                    {"eval.test_loss", 2}, {"eval.test_acc", 2}};

TEST(Report, EachSeriesHasOneCommandPerRecord) {
  test::TempDir d;
  const std::string html = render_report({load_run_report_data(write_run(d, "alpha"))}, kDefaults);
  const auto paths = series_paths(html);
  ASSERT_EQ(paths.size(), kExpectedPoints.size()) << html;
  for (const auto& p : paths) {
    const std::string id = p.attrs.at("data-series");
    ASSERT_TRUE(kExpectedPoints.count(id)) << id;
    EXPECT_EQ(p.commands, kExpectedPoints.at(id)) << id << ": " << p.attrs.at("d");
    EXPECT_EQ(p.attrs.at("data-points"), std::to_string(kExpectedPoints.at(id))) << id;
    EXPECT_EQ(p.attrs.at("data-run"), "alpha");
    EXPECT_EQ(p.attrs.at("d").rfind("M ", 0), 0u) << id;
  }
}

TEST(Report, ShowsVerdictBreakdownEnvironmentAndFiles) {
  test::TempDir d;
  const std::string html = render_report({load_run_report_data(write_run(d, "alpha"))}, kDefaults);
  test::expect_contains(
      html, {"id=\"verdict\" class=\"verdict\">compute-bound</span>", "83% of step time", "a bigger batch or bf16",
             "data-phase=\"forward\"", "data-phase=\"other\"", "85.00%", "0.4123", "1235", "ab12cd34ef56ab12", "1.13.1",
             "channels_last", "Xeon &amp; co", "ulimit -n 65536", "badge warn", "train/17 &lt;bad jpeg&gt;",
             "step-00000035.ckpt", "Share of step time per logged interval"});
  EXPECT_EQ(html.find(".tmp-123"), std::string::npos);
  // The bar follows the step's pipeline order, whatever order summary.json's keys come in
  // (nlohmann::json sorts them: backward first).
  const size_t wait = html.find("data-phase=\"data_wait\""), fwd = html.find("data-phase=\"forward\""),
               bwd = html.find("data-phase=\"backward\""), other = html.find("data-phase=\"other\"");
  EXPECT_LT(wait, fwd);
  EXPECT_LT(fwd, bwd);
  EXPECT_LT(bwd, other);
}

TEST(Report, VerdictFallsBackToTheLastTrainRecordWithoutSummary) {
  test::TempDir d;
  const std::string html = render_report({load_run_report_data(write_run(d, "beta", 0, false))}, kDefaults);
  test::expect_contains(html, {"run in progress", "id=\"verdict\" class=\"verdict\">compute-bound</span>"});
  EXPECT_EQ(series_paths(html).size(), kExpectedPoints.size());
}

TEST(Report, MarksChangedKeysWithTheirDefault) {
  test::TempDir d;
  const std::string html = render_report({load_run_report_data(write_run(d, "alpha"))}, kDefaults);
  test::expect_contains(html, {"<tr class=\"changed\"><td class=\"key\">train.batch_size</td><td class=\"val\">128"
                               "</td><td class=\"def\">256</td></tr>",
                               "<tr class=\"changed\"><td class=\"key\">data.mean</td><td class=\"val\">[0.5]</td>"
                               "<td class=\"def\">[0.286]</td></tr>",
                               "<tr><td class=\"key\">train.lr</td><td class=\"val\">0.002</td>",
                               "<tr><td class=\"key\">train.precision</td>"});
}

TEST(Report, EscapesTextAndLoadsNothingFromOutside) {
  test::TempDir d;
  const std::string html = render_report({load_run_report_data(write_run(d, "alpha"))}, kDefaults);
  test::expect_contains(html, "&quot;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more&quot;");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  const std::regex url(R"((src|href)\s*=\s*["']?\s*(https?:|//))", std::regex::icase);
  EXPECT_FALSE(std::regex_search(html, url));
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
}

TEST(Report, ComparesRunsOnOnePage) {
  test::TempDir d;
  const std::string html = render_report(
      {load_run_report_data(write_run(d, "alpha")), load_run_report_data(write_run(d, "beta", 0.5))}, kDefaults);
  std::map<std::string, int> per_run;
  for (const auto& p : series_paths(html)) {
    ++per_run[p.attrs.at("data-run")];
    EXPECT_EQ(p.commands, kExpectedPoints.at(p.attrs.at("data-series")));
  }
  EXPECT_EQ(per_run["alpha"], 6);
  EXPECT_EQ(per_run["beta"], 6);
  // Only the keys that differ between the runs: run.name and train.batch_size (128 vs 133).
  test::expect_contains(html, {"Comparison of 2 runs", "<td class=\"key\">run.name</td>",
                               "<td class=\"key\">train.batch_size</td>", "stroke=\"#dc2626\""});
  EXPECT_EQ(html.find("<td class=\"key\">train.lr</td>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(Report, BadFilesAreBadInputNamingFileAndLine) {
  test::TempDir d;
  const std::string dir = write_run(d, "alpha");
  std::string metrics = test::read_text(dir + "/metrics.jsonl");
  const size_t third = metrics.find('\n', metrics.find('\n') + 1) + 1;
  test::write_text(dir + "/metrics.jsonl",
                   metrics.substr(0, third) + "{\"type\": \"train\", \"step\": \n" + metrics.substr(third));
  test::expect_bad_input([&] { load_run_report_data(dir); }, {"metrics.jsonl:3:", "expected one JSON object per line"});
  test::write_text(dir + "/metrics.jsonl", metrics.substr(0, third) + "[1, 2]\n");
  test::expect_bad_input([&] { load_run_report_data(dir); }, {"metrics.jsonl:3:", "found a JSON array"});

  // A half-written last line (no newline yet) is a write in progress: left out, not an error.
  test::write_text(dir + "/metrics.jsonl", metrics + "{\"type\": \"tra");
  const RunReportData r = load_run_report_data(dir);
  EXPECT_TRUE(r.torn_last_line);
  EXPECT_EQ(r.records->size(), 9u);

  test::write_text(dir + "/metrics.jsonl", metrics);
  test::write_text(dir + "/config.toml", "[train\nbatch_size = 1\n");
  test::expect_bad_input([&] { load_run_report_data(dir); }, {"config.toml:1:", "invalid TOML"});
  fs::remove(dir + "/config.toml");
  test::expect_bad_input([&] { load_run_report_data(dir); }, {"config.toml: missing"});
  test::expect_bad_input([&] { load_run_report_data(d / "nope"); }, {"nope: no such run folder"});
  fs::remove(dir + "/metrics.jsonl");
  test::expect_bad_input([&] { load_run_report_data(dir); }, {"metrics.jsonl: missing"});
}

TEST(Report, WritesReportHtmlInTheRunFolder) {
  test::TempDir d;
  const std::string dir = write_run(d, "alpha");
  const std::string path = write_run_report(dir, kDefaults);
  EXPECT_EQ(path, dir + "/report.html");
  const std::string html = test::read_text(path);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(series_paths(html).size(), kExpectedPoints.size());
}

}  // namespace
}  // namespace crucible::obs
