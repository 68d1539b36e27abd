// The run report (see report.h). The page is written by hand as text: inline SVG for the charts
// (no Debian package draws SVG charts from C++), one <style> block, no script and no URL, so it
// renders the same offline, in a mail client, or as a screenshot.
#include "crucible/obs/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "crucible/core/error.h"
#include "crucible/core/memory.h"
#include "crucible/core/file.h"

namespace crucible::obs {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// ---- text ---------------------------------------------------------------------------------

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 4 significant digits; integers as integers.
std::string num(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "∞" : "−∞");
  if (v == std::floor(v) && std::fabs(v) < 1e9) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.4g}", v);
}

// A JSON value as page text (not yet escaped).
std::string json_text(const Json& v) {
  if (v.is_null()) return "—";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) return num(v.get<double>());
  return v.dump();
}

const Json* field(const Json* obj, const char* key) {
  if (obj == nullptr || !obj->is_object()) return nullptr;
  auto it = obj->find(key);
  return it == obj->end() ? nullptr : &*it;
}

bool number_at(const Json* obj, const char* key, double* out) {
  const Json* v = field(obj, key);
  if (v == nullptr || !v->is_number()) return false;
  *out = v->get<double>();
  return true;
}

std::string string_at(const Json* obj, const char* key) {
  const Json* v = field(obj, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

// ---- TOML, flattened to dotted keys -----------------------------------------------------

struct TomlEntry {
  std::string key;              // "train.batch_size"
  std::string text;             // the value as TOML: 256, "bf16", [0.286]
  std::vector<double> numbers;  // the value's numbers (scalar or array) when it is numeric
  bool numeric = false;
  uint64_t line = 0, column = 0;  // where it stands in its document (for document order)
};

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string toml_text(const toml::node& n, std::vector<double>* numbers, bool* numeric) {
  if (auto s = n.as_string()) {
    *numeric = false;
    return toml_string(s->get());
  }
  if (auto i = n.as_integer()) {
    numbers->push_back(static_cast<double>(i->get()));
    return std::to_string(i->get());
  }
  if (auto f = n.as_floating_point()) {
    numbers->push_back(f->get());
    return fmt::format("{}", f->get());
  }
  if (auto b = n.as_boolean()) {
    *numeric = false;
    return b->get() ? "true" : "false";
  }
  if (auto a = n.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + toml_text(*a->get(i), numbers, numeric);
    return out + "]";
  }
  if (auto t = n.as_table()) {  // an inline table inside an array
    *numeric = false;
    std::string out = "{";
    bool first = true;
    for (auto&& [k, v] : *t) {
      out += fmt::format("{}{} = {}", first ? " " : ", ", k.str(), toml_text(v, numbers, numeric));
      first = false;
    }
    return out + " }";
  }
  *numeric = false;
  std::ostringstream os;  // dates and times
  n.visit([&](auto&& v) { os << v; });
  return os.str();
}

void flatten(const toml::table& t, const std::string& prefix, std::vector<TomlEntry>* out) {
  for (auto&& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (auto sub = node.as_table(); sub != nullptr && !sub->is_inline()) {
      flatten(*sub, key, out);
      continue;
    }
    TomlEntry e;
    e.key = key;
    e.numeric = true;
    e.text = toml_text(node, &e.numbers, &e.numeric);
    e.line = node.source().begin.line;
    e.column = node.source().begin.column;
    out->push_back(std::move(e));
  }
}

toml::table parse_toml(const std::string& text, const std::string& origin, const char* expected) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw bad_input("{}:{}:{}: invalid TOML: {} (expected {})", origin, e.source().begin.line, e.source().begin.column,
                    e.description(), expected);
  }
}

// Every key of the document as "section.key", in document order (toml++ keeps tables sorted).
std::vector<TomlEntry> flat_toml(const std::string& text, const std::string& origin) {
  std::vector<TomlEntry> out;
  flatten(parse_toml(text, origin, "a TOML document"), "", &out);
  std::stable_sort(out.begin(), out.end(), [](const TomlEntry& a, const TomlEntry& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  return out;
}

// Same value: numbers compare as numbers (so 1 and 1.0 agree), everything else as TOML text.
bool same_value(const TomlEntry& a, const TomlEntry& b) {
  if (a.numeric && b.numeric) return a.numbers == b.numbers;
  return a.text == b.text;
}

const TomlEntry* find_entry(const std::vector<TomlEntry>& v, const std::string& key) {
  for (const auto& e : v) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

// ---- charts ---------------------------------------------------------------------------------

constexpr double kW = 560, kH = 220, kLeft = 64, kRight = 14, kTop = 12, kBottom = 42;
constexpr const char* kTrainColour = "#2563eb";
constexpr const char* kEvalColour = "#ea580c";
constexpr const char* kEmaColour = "#16a34a";  // the weight EMA's evaluation
constexpr const char* kRunColours[] = {"#2563eb", "#dc2626", "#16a34a", "#9333ea",
                                       "#ea580c", "#0891b2", "#a16207", "#db2777"};

std::string run_colour(size_t i) {
  return kRunColours[i % (sizeof(kRunColours) / sizeof(kRunColours[0]))];
}

struct Series {
  std::string id;     // data-series: "train.loss", "eval.test_acc"
  std::string run;    // data-run
  std::string label;  // legend text
  std::string colour;
  bool dashed = false;                            // eval series: dashed with markers
  std::vector<std::pair<double, double>> points;  // (step, value), one per record
};

// Points of `key` in records of `type` that carry a number for it (JSON null: skipped).
std::vector<std::pair<double, double>> extract(const Json& records, const std::string& type, const char* key) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& r : records) {
    if (!r.is_object() || string_at(&r, "type") != type) continue;
    double x = 0, y = 0;
    if (number_at(&r, "step", &x) && number_at(&r, key, &y)) pts.emplace_back(x, y);
  }
  return pts;
}

struct Axis {
  double lo = 0, hi = 1, step = 1;
};

// An axis over [lo, hi] with "nice" ticks (1, 2 or 5 × 10^k) at both ends.
Axis nice_axis(double lo, double hi, int ticks = 4) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  Axis a;
  a.step = step;
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  return a;
}

std::string coord(double v) {
  return fmt::format("{:.1f}", v);
}

std::string legend_item(const std::string& colour, bool dashed, const std::string& label) {
  return fmt::format("<span><i class=\"sw{}\" style=\"border-color:{}\"></i>{}</span>", dashed ? " dash" : "", colour,
                     esc(label));
}

// One entry per series; on a comparison page one per run (its colour) and one per line style.
std::string legend_html(const std::vector<Series>& series, bool compare) {
  std::string out = "<div class=\"legend\">";
  if (!compare) {
    for (const auto& s : series) {
      if (!s.points.empty()) out += legend_item(s.colour, s.dashed, s.label);
    }
    return out + "</div>";
  }
  std::vector<std::string> runs, styles;
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    const std::string run = legend_item(s.colour, false, s.run);
    if (std::find(runs.begin(), runs.end(), run) == runs.end()) runs.push_back(run);
    const std::string style = legend_item("#6b7385", s.dashed, s.label);
    if (std::find(styles.begin(), styles.end(), style) == styles.end()) styles.push_back(style);
  }
  for (const auto& r : runs) out += r;
  if (styles.size() > 1) {
    for (const auto& st : styles) out += st;
  }
  return out + "</div>";
}

// One chart: `series` over step, grid lines, tick labels at the ends and between, axis titles.
// Each non-empty series is one <path class="series"> with one M/L command per point.
std::string chart(const std::string& title, const std::string& y_title, const std::vector<Series>& series,
                  bool compare) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  }
  std::string out = fmt::format("<figure class=\"chart\"><figcaption>{}</figcaption>", esc(title));
  if (!(xlo <= xhi)) {
    return out + "<p class=\"muted\">no records yet</p></figure>";
  }
  out += legend_html(series, compare);
  const Axis ax = nice_axis(xlo, xhi), ay = nice_axis(ylo, yhi);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };

  out += fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"{}\">",
      kW, kH, kW, kH, esc(title));
  out += "<g class=\"grid\">";
  for (double y = ay.lo; y <= ay.hi + ay.step * 1e-6; y += ay.step) {
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", coord(kLeft), coord(sy(y)), coord(kLeft + pw),
                       coord(sy(y)));
  }
  for (double x = ax.lo; x <= ax.hi + ax.step * 1e-6; x += ax.step) {
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", coord(sx(x)), coord(kTop), coord(sx(x)),
                       coord(kTop + ph));
  }
  out += "</g><g class=\"axis\">";
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>", coord(kLeft), coord(kTop),
                     coord(pw), coord(ph));
  for (double y = ay.lo; y <= ay.hi + ay.step * 1e-6; y += ay.step) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", coord(kLeft - 6), coord(sy(y) + 4),
                       esc(num(std::fabs(y) < ay.step * 1e-9 ? 0.0 : y)));
  }
  for (double x = ax.lo; x <= ax.hi + ax.step * 1e-6; x += ax.step) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", coord(sx(x)), coord(kTop + ph + 16),
                       esc(num(x)));
  }
  out += fmt::format("<text class=\"title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>",
                     coord(kLeft + pw / 2), coord(kH - 6));
  out +=
      fmt::format("<text class=\"title\" transform=\"translate(14 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                  coord(kTop + ph / 2), esc(y_title));
  out += "</g>";
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    std::string d;
    for (size_t i = 0; i < s.points.size(); ++i) {
      d += fmt::format("{}{} {} {}", i ? " " : "", i ? 'L' : 'M', coord(sx(s.points[i].first)),
                       coord(sy(s.points[i].second)));
    }
    out += fmt::format(
        "<path class=\"series\" data-series=\"{}\" data-run=\"{}\" data-points=\"{}\" stroke=\"{}\"{} "
        "d=\"{}\"/>",
        esc(s.id), esc(s.run), s.points.size(), s.colour, s.dashed ? " stroke-dasharray=\"6 4\"" : "", d);
    if (s.dashed) {  // eval points are few: mark each
      out += fmt::format("<g fill=\"{}\">", s.colour);
      for (const auto& [x, y] : s.points) {
        out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\"/>", coord(sx(x)), coord(sy(y)));
      }
      out += "</g>";
    }
  }
  return out + "</svg></figure>";
}

struct ChartSpec {
  const char* title;
  const char* y_title;
  std::vector<std::pair<const char*, const char*>> series;  // (type, key)
  bool only_with_data = false;  // drawn only when some series has points (a detector's charts)
};

const std::vector<ChartSpec>& chart_specs() {
  static const std::vector<ChartSpec> specs = {
      // test_*_ema: the weight EMA's evaluation (train.ema), drawn only where the records carry it.
      {"Loss", "loss", {{"train", "loss"}, {"eval", "test_loss"}, {"eval", "test_loss_ema"}}},
      {"Accuracy", "accuracy", {{"train", "acc"}, {"eval", "test_acc"}, {"eval", "test_acc_ema"}}},
      {"Learning rate", "lr", {{"train", "lr"}}},
      {"Throughput", "samples/s", {{"train", "samples_per_s"}}},
      // A detector's: its loss terms (torchvision's names) and COCO's AP after each evaluation.
      {"Detection loss terms",
       "loss",
       {{"train", "loss_classification"}, {"train", "loss_bbox_regression"}, {"train", "loss_bbox_ctrness"}},
       true},
      {"COCO AP", "AP", {{"eval", "test_AP"}, {"eval", "test_AP50"}, {"eval", "test_AP75"}}, true},
  };
  return specs;
}

std::string series_label(const std::string& type, const std::string& key) {
  if (type == "eval") {
    if (key == "test_loss_ema") return "test loss (EMA)";
    if (key == "test_acc_ema") return "test acc (EMA)";
    if (key.rfind("test_AP", 0) == 0) return key.substr(5);  // "AP", "AP50", "AP75"
    return key == "test_loss" ? "test loss" : key == "test_acc" ? "test acc" : key;
  }
  if (key == "samples_per_s") return "samples/s";
  return "train " + key;
}

// ---- step-time breakdown ----------------------------------------------------------------------

std::string phase_colour(const std::string& phase, size_t i) {
  static const std::map<std::string, std::string> known = {
      {"data_wait", "#e45756"},     {"transfer", "#f58518"},  {"forward", "#4c78a8"},   {"backward", "#72b7b2"},
      {"communication", "#b279a2"}, {"optimizer", "#54a24b"}, {"host_sync", "#eeca3b"}, {"other", "#bab0ac"}};
  static const char* extra[] = {"#9d755d", "#ff9da6", "#79706e", "#d67195", "#439894", "#83bcb6"};
  auto it = known.find(phase);
  return it != known.end() ? it->second : extra[i % (sizeof(extra) / sizeof(extra[0]))];
}

// The phases a step goes through, in order; a bar lists them so (a writer's JSON may have
// sorted its keys), then any other phase in the order it came.
void pipeline_order(std::vector<std::string>* names) {
  static const std::vector<std::string> kOrder = {"data_wait",     "transfer",  "forward",   "backward",
                                                  "communication", "optimizer", "host_sync", "other"};
  auto rank = [](const std::string& n) {
    const auto it = std::find(kOrder.begin(), kOrder.end(), n);
    return it == kOrder.end() ? kOrder.size() : static_cast<size_t>(it - kOrder.begin());
  };
  std::stable_sort(names->begin(), names->end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
}

// (phase, seconds) of summary.breakdown.phases in pipeline order; non-numbers skipped.
std::vector<std::pair<std::string, double>> phases_of(const Json* summary) {
  std::vector<std::pair<std::string, double>> out;
  const Json* phases = field(field(summary, "breakdown"), "phases");
  if (phases == nullptr || !phases->is_object()) return out;
  std::vector<std::string> names;
  for (auto it = phases->begin(); it != phases->end(); ++it) {
    if (it.value().is_number() && it.value().get<double>() >= 0) names.push_back(it.key());
  }
  pipeline_order(&names);
  for (const auto& n : names) out.emplace_back(n, phases->at(n).get<double>());
  return out;
}

// A horizontal stacked bar: one rect per phase, width proportional to its seconds.
std::string stacked_bar(const std::vector<std::pair<std::string, double>>& phases, double width = 1000) {
  double total = 0;
  for (const auto& p : phases) total += p.second;
  std::string out = fmt::format(
      "<svg class=\"bar\" viewBox=\"0 0 {} 44\" width=\"{}\" height=\"44\" role=\"img\" "
      "aria-label=\"step-time breakdown\">",
      width, width);
  if (total <= 0) return out + "</svg>";
  double x = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const double w = phases[i].second / total * width;
    const double pct = 100 * phases[i].second / total;
    out += fmt::format(
        "<rect class=\"phase\" data-phase=\"{}\" x=\"{}\" y=\"2\" width=\"{}\" height=\"40\" "
        "fill=\"{}\"><title>{}: {} s ({:.1f}%)</title></rect>",
        esc(phases[i].first), coord(x), coord(w), phase_colour(phases[i].first, i), esc(phases[i].first),
        num(phases[i].second), pct);
    const std::string label = fmt::format("{} {:.0f}%", phases[i].first, pct);
    if (w > 7.0 * static_cast<double>(label.size()) + 8) {
      out += fmt::format("<text x=\"{}\" y=\"27\" text-anchor=\"middle\" class=\"onbar\">{}</text>", coord(x + w / 2),
                         esc(label));
    } else if (w > 34) {
      out += fmt::format("<text x=\"{}\" y=\"27\" text-anchor=\"middle\" class=\"onbar\">{:.0f}%</text>",
                         coord(x + w / 2), pct);
    }
    x += w;
  }
  return out + "</svg>";
}

std::string phase_table(const std::vector<std::pair<std::string, double>>& phases) {
  double total = 0;
  for (const auto& p : phases) total += p.second;
  std::string out =
      "<table class=\"phases\"><tr><th>phase</th><th class=\"num\">seconds</th><th class=\"num\">share "
      "of step time</th></tr>";
  for (size_t i = 0; i < phases.size(); ++i) {
    out += fmt::format(
        "<tr><td><i class=\"box\" style=\"background:{}\"></i>{}</td><td class=\"num\">{}</td>"
        "<td class=\"num\">{:.1f}%</td></tr>",
        phase_colour(phases[i].first, i), esc(phases[i].first), num(phases[i].second),
        total > 0 ? 100 * phases[i].second / total : 0.0);
  }
  return out + "</table>";
}

// Per-interval shares (train records' "breakdown"): one stacked column per logged interval.
std::string interval_chart(const Json& records) {
  std::vector<std::string> order;
  std::vector<std::pair<double, const Json*>> cols;
  for (const auto& r : records) {
    const Json* b = field(&r, "breakdown");
    double step = 0;
    if (string_at(&r, "type") != "train" || b == nullptr || !b->is_object() || !number_at(&r, "step", &step)) continue;
    cols.emplace_back(step, b);
    for (auto it = b->begin(); it != b->end(); ++it) {
      if (std::find(order.begin(), order.end(), it.key()) == order.end()) order.push_back(it.key());
    }
  }
  if (cols.empty()) return "";
  pipeline_order(&order);
  const double pw = kW * 2 - kLeft - kRight, ph = 140, top = 8, h = top + ph + 36;
  std::string out =
      "<figure class=\"chart wide\"><figcaption>Share of step time per logged interval</figcaption>"
      "<div class=\"legend\">";
  for (size_t i = 0; i < order.size(); ++i) {
    out += fmt::format("<span><i class=\"box\" style=\"background:{}\"></i>{}</span>", phase_colour(order[i], i),
                       esc(order[i]));
  }
  out += fmt::format(
      "</div><svg class=\"chart\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"share of step time per interval\"><g class=\"grid\">",
      kW * 2, h, kW * 2, h);
  for (int p = 0; p <= 4; ++p) {
    const double y = top + ph - ph * p / 4.0;
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", coord(kLeft), coord(y), coord(kLeft + pw),
                       coord(y));
  }
  out += "</g><g class=\"axis\">";
  for (int p = 0; p <= 4; ++p) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}%</text>", coord(kLeft - 6),
                       coord(top + ph - ph * p / 4.0 + 4), 25 * p);
  }
  const double slot = pw / static_cast<double>(cols.size());
  const double bw = std::max(1.0, slot * 0.8);
  const size_t label_every = std::max<size_t>(1, cols.size() / 8);
  for (size_t c = 0; c < cols.size(); ++c) {
    if (c % label_every == 0 || c + 1 == cols.size()) {
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", coord(kLeft + slot * (c + 0.5)),
                         coord(top + ph + 15), num(cols[c].first));
    }
  }
  out += fmt::format("<text class=\"title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">step (end of interval)</text>",
                     coord(kLeft + pw / 2), coord(h - 4));
  out += "</g>";
  for (size_t c = 0; c < cols.size(); ++c) {
    double total = 0;
    for (const auto& phase : order) {
      double v = 0;
      if (number_at(cols[c].second, phase.c_str(), &v) && v > 0) total += v;
    }
    const double scale = total > 1 ? 1 / total : 1;  // shares sum to 1; guard against rounding above it
    double y = top + ph;
    for (size_t i = 0; i < order.size(); ++i) {
      double v = 0;
      if (!number_at(cols[c].second, order[i].c_str(), &v) || v <= 0) continue;
      const double hh = v * scale * ph;
      y -= hh;
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>step {}: {} "
          "{:.1f}%</title></rect>",
          coord(kLeft + slot * c + (slot - bw) / 2), coord(y), coord(bw), coord(hh), phase_colour(order[i], i),
          num(cols[c].first), esc(order[i]), 100 * v * scale);
    }
  }
  return out + "</svg></figure>";
}

// ---- page pieces ------------------------------------------------------------------------------

constexpr const char* kStyle = R"css(
*{box-sizing:border-box}
body{margin:0;background:#f3f4f7;color:#1c2230;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Noto Sans","Liberation Sans","DejaVu Sans",sans-serif}
.page{max-width:1180px;margin:0 auto;padding:24px}
header.top,section{background:#fff;border-radius:10px;padding:18px 24px;margin-bottom:16px;box-shadow:0 1px 3px rgba(16,24,40,.08)}
h1{font-size:24px;margin:0 0 2px}
h2{font-size:16px;margin:0 0 12px;color:#2b3345}
.sub,.muted{color:#6b7385}
.stats{display:grid;grid-template-columns:repeat(auto-fit,minmax(140px,1fr));gap:10px;margin-top:14px}
.stat{background:#f5f7fb;border-radius:8px;padding:10px 12px;min-width:0}
.stat .k{color:#6b7385;font-size:11px;text-transform:uppercase;letter-spacing:.05em}
.stat .v{font-size:20px;font-weight:650;overflow-wrap:anywhere}
.stat .v.small{font-size:12px;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-weight:500}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600}
.inprogress{background:#fff4d6;color:#8a5a00}
.verdict-line{display:flex;gap:14px;align-items:center;flex-wrap:wrap}
.verdict{font-size:20px;font-weight:700;padding:4px 14px;border-radius:8px;background:#e7efff;color:#1d4ed8}
.charts{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px 22px}
figure{margin:0;min-width:0}
figure.wide{grid-column:1/-1}
figcaption{font-weight:600;margin-bottom:2px}
svg.chart,svg.bar{width:100%;height:auto;display:block}
.legend{font-size:12px;color:#4a5263;margin-bottom:2px}
.legend span{margin-right:14px;white-space:nowrap}
.sw{display:inline-block;width:20px;height:0;border-top:3px solid;vertical-align:middle;margin-right:5px}
.sw.dash{border-top-style:dashed}
.box{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin-right:6px}
.grid line{stroke:#e7e9ee;stroke-width:1}
.axis text{font-size:11px;fill:#6b7385}
.axis text.title{font-size:12px;fill:#3d4556}
.axis rect.frame{fill:none;stroke:#c9cdd6}
path.series{fill:none;stroke-width:2;stroke-linejoin:round;stroke-linecap:round}
text.onbar{font-size:13px;fill:#fff;font-weight:600}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 10px;border-bottom:1px solid #eceef2;vertical-align:top;overflow-wrap:anywhere}
th{color:#5a6275;font-weight:600;background:#fafbfc}
.num{text-align:right;font-variant-numeric:tabular-nums}
td.key,td.val,td.def{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12px}
tr.changed td,td.changed{background:#fff7db}
tr.changed td.key{font-weight:700}
td.def{color:#8a6a00}
.ok{background:#e3f6e8;color:#1e7b34}.warn{background:#fff4d6;color:#8a5a00}.fail{background:#fde2e1;color:#b3261e}
.cols{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:22px;align-items:start}
ul.files{margin:0;padding-left:18px;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12px}
footer{color:#8a91a1;font-size:12px;text-align:center;margin:8px 0 24px}
)css";

struct RunView {
  const RunReportData* data;
  std::string label;   // the name shown and put in data-run (the folder name; the path when names repeat)
  std::string colour;  // comparison colour
  const Json* summary() const { return data->summary.get(); }
  const Json& records() const { return *data->records; }
};

const Json* last_record(const Json& records, const std::string& type) {
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (string_at(&*it, "type") == type) return &*it;
  }
  return nullptr;
}

std::string pct_or_dash(const Json* obj, const char* key) {
  double v = 0;
  return number_at(obj, key, &v) ? fmt::format("{:.2f}%", 100 * v) : "—";
}

std::string num_or_dash(const Json* obj, const char* key) {
  const Json* v = field(obj, key);
  return v == nullptr ? "—" : json_text(*v);
}

std::string stat(const std::string& k, const std::string& v, bool small = false) {
  return fmt::format("<div class=\"stat\"><div class=\"k\">{}</div><div class=\"v{}\">{}</div></div>", esc(k),
                     small ? " small" : "", esc(v));
}

std::string header_html(const RunView& r) {
  const Json* s = r.summary();
  std::string out = fmt::format("<header class=\"top\"><h1>{}</h1>", esc(r.label));
  if (s != nullptr) {
    out += fmt::format("<div class=\"sub\">crucible {} · torch {} · {}</div>", esc(num_or_dash(s, "crucible_version")),
                       esc(num_or_dash(s, "torch_version")), esc(r.data->dir));
    out += "<div class=\"stats\">";
    if (field(s, "test_AP") != nullptr) {  // a detector: COCO's numbers
      out += stat("test AP", num_or_dash(s, "test_AP"));
      out += stat("AP50 / AP75", num_or_dash(s, "test_AP50") + " / " + num_or_dash(s, "test_AP75"));
      out += stat("AR@100", num_or_dash(s, "test_AR100"));
    } else {
      out += stat("test accuracy", pct_or_dash(s, "test_acc"));
      out += stat("test loss", num_or_dash(s, "test_loss"));
    }
    if (field(s, "test_acc_ema") != nullptr) out += stat("test accuracy (EMA weights)", pct_or_dash(s, "test_acc_ema"));
    out += stat("steps", num_or_dash(s, "steps"));
    out += stat("samples/s", num_or_dash(s, "samples_per_s"));
    out += stat("params sha256 (digest)", num_or_dash(s, "params_sha256"), true);
    out += "</div>";
  } else {
    const Json* train = last_record(r.records(), "train");
    const Json* eval = last_record(r.records(), "eval");
    out += fmt::format(
        "<div class=\"sub\"><span class=\"badge inprogress\">run in progress</span> no summary.json "
        "yet; figures below are the latest records · {}</div>",
        esc(r.data->dir));
    out += "<div class=\"stats\">";
    out += stat("latest test accuracy", pct_or_dash(eval, "test_acc"));
    out += stat("latest test loss", num_or_dash(eval, "test_loss"));
    out += stat("steps so far", num_or_dash(train, "step"));
    out += stat("samples/s (latest)", num_or_dash(train, "samples_per_s"));
    out += "</div>";
  }
  return out + "</header>";
}

// The verdict: summary.bottleneck, else the last train record's "verdict".
struct Verdict {
  std::string verdict, evidence, fix;
  double share = -1;
  std::string source;
};

bool verdict_of(const RunView& r, Verdict* v) {
  const Json* b = field(r.summary(), "bottleneck");
  if (b != nullptr && b->is_object() && !string_at(b, "verdict").empty()) {
    v->verdict = string_at(b, "verdict");
    v->evidence = string_at(b, "evidence");
    v->fix = string_at(b, "fix");
    number_at(b, "share", &v->share);
    v->source = "summary.json";
    return true;
  }
  for (auto it = r.records().rbegin(); it != r.records().rend(); ++it) {
    if (string_at(&*it, "type") != "train") continue;
    const std::string s = string_at(&*it, "verdict");
    if (s.empty()) continue;
    v->verdict = s;
    v->source = fmt::format("the train record of step {}", num_or_dash(&*it, "step"));
    return true;
  }
  return false;
}

std::string verdict_html(const RunView& r) {
  std::string out = "<section class=\"bottleneck\"><h2>Bottleneck</h2>";
  Verdict v;
  if (!verdict_of(r, &v)) {
    return out +
           "<p class=\"muted\">no verdict recorded (the run has not logged its step-time breakdown yet)</p>"
           "</section>";
  }
  out += fmt::format("<div class=\"verdict-line\"><span id=\"verdict\" class=\"verdict\">{}</span>", esc(v.verdict));
  if (v.share >= 0) out += fmt::format("<span>{:.0f}% of step time</span>", 100 * v.share);
  out += fmt::format("<span class=\"muted\">from {}</span></div>", esc(v.source));
  if (!v.evidence.empty()) out += fmt::format("<p><b>Evidence.</b> {}</p>", esc(v.evidence));
  if (!v.fix.empty()) out += fmt::format("<p><b>Fix.</b> {}</p>", esc(v.fix));
  return out + "</section>";
}

std::string breakdown_html(const RunView& r) {
  const auto phases = phases_of(r.summary());
  const std::string intervals = interval_chart(r.records());
  if (phases.empty() && intervals.empty()) return "";
  std::string out = "<section class=\"breakdown\"><h2>Where the step time goes</h2>";
  if (!phases.empty()) {
    const Json* b = field(r.summary(), "breakdown");
    double step_s = 0, ce = 0;
    std::string line;
    if (number_at(b, "step_seconds", &step_s)) line += fmt::format("step time {} s", num(step_s));
    if (number_at(b, "checkpoint_eval_seconds", &ce)) {
      line += fmt::format("{}checkpoints and evaluation {} s (outside the steps)", line.empty() ? "" : " · ", num(ce));
    }
    if (!line.empty()) out += fmt::format("<p class=\"muted\">{}</p>", esc(line));
    out += stacked_bar(phases) + phase_table(phases);
  }
  if (!intervals.empty()) out += "<div class=\"charts\" style=\"margin-top:14px\">" + intervals + "</div>";
  return out + "</section>";
}

// Remote data (issue 37): each remote split's requests, retries and shard cache, one line each.
std::string remote_html(const Json* io) {
  std::string out;
  for (const char* split : {"train", "test"}) {
    const Json* r = field(field(io, split), "remote");
    if (r == nullptr || !r->is_object()) continue;
    double requests = 0, retries = 0, bytes = 0, downloads = 0, hits = 0, evictions = 0, failed = 0, used = 0, max = 0;
    number_at(r, "requests", &requests);
    number_at(r, "retries", &retries);
    number_at(r, "bytes", &bytes);
    number_at(r, "downloads", &downloads);
    number_at(r, "cache_hits", &hits);
    number_at(r, "evictions", &evictions);
    number_at(r, "failed_checks", &failed);
    number_at(r, "cache_used_bytes", &used);
    number_at(r, "cache_bytes", &max);
    out += fmt::format("<p>{} split, remote: {} requests ({} retries), {} received; shard cache {}: {} downloads, {} "
                       "found there, {} evictions, {} failed checks, {} of {} held</p>",
                       split, num(requests), num(retries), esc(human_bytes(static_cast<uint64_t>(bytes))),
                       esc(string_at(r, "cache_dir")), num(downloads), num(hits), num(evictions), num(failed),
                       esc(human_bytes(static_cast<uint64_t>(used))), esc(human_bytes(static_cast<uint64_t>(max))));
  }
  return out;
}

// D11: summary.io, each split's reads: files and bytes, their rates over the time the split was
// served, the time per read, and the RAM cache's hits; for remote data its requests and cache.
std::string io_html(const RunView& r) {
  const Json* io = field(r.summary(), "io");
  if (io == nullptr || !io->is_object() || io->empty()) return "";
  std::string rows;
  for (const char* split : {"train", "test"}) {
    const Json* s = field(io, split);
    if (s == nullptr || !s->is_object()) continue;
    double files = 0, bytes = 0, fps = 0, bps = 0, ms = 0;
    number_at(s, "files", &files);
    number_at(s, "bytes", &bytes);
    const bool rates = number_at(s, "files_per_s", &fps) && number_at(s, "bytes_per_s", &bps);
    const bool latency = number_at(s, "ms_per_file", &ms);
    const Json* cache = field(s, "cache");
    std::string cache_text = "none";
    if (cache != nullptr && cache->is_object()) {
      double hits = 0, misses = 0;
      number_at(cache, "hits", &hits);
      number_at(cache, "misses", &misses);
      cache_text = string_at(cache, "mode") +
                   (hits + misses > 0 ? fmt::format(": {:.1f}% hits ({} of {})", 100 * hits / (hits + misses),
                                                    num(hits), num(hits + misses))
                                      : ": no lookups");
    }
    rows += fmt::format(
        "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
        "<td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
        split, num(files), esc(human_bytes(static_cast<uint64_t>(bytes))), rates ? num(std::round(fps)) : "—",
        rates ? esc(human_bytes(static_cast<uint64_t>(bps))) + "/s" : "—", latency ? fmt::format("{:.3f}", ms) : "—",
        esc(cache_text));
  }
  if (rows.empty()) return "";
  return "<section class=\"io\"><h2>Reading the data</h2><p class=\"muted\">this session's reads by rank 0, each "
         "split's rates over the time it was being served (D11)</p><table><tr><th>split</th><th class=\"num\">files"
         "</th><th class=\"num\">bytes</th><th class=\"num\">files/s</th><th class=\"num\">bytes/s</th>"
         "<th class=\"num\">ms per read</th><th>RAM cache</th></tr>" +
         rows + "</table>" + remote_html(io) + "</section>";
}

// train.profile = "full": summary.layers, each layer's forward and backward milliseconds a step.
std::string layers_html(const RunView& r) {
  const Json* layers = field(r.summary(), "layers");
  if (layers == nullptr || !layers->is_array() || layers->empty()) return "";
  std::string rows;
  for (const auto& l : *layers) {
    const Json* name = field(&l, "name");
    double fwd = 0, bwd = 0, share = 0;
    number_at(&l, "forward_ms_per_step", &fwd);
    number_at(&l, "backward_ms_per_step", &bwd);
    number_at(&l, "share", &share);
    rows += fmt::format(
        "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1f}%</td></tr>",
        esc(name != nullptr && name->is_string() ? name->get<std::string>() : "?"), num(fwd), num(bwd), 100 * share);
  }
  return "<section class=\"layers\"><h2>Time by layer</h2><p class=\"muted\">train.profile = \"full\": each "
         "layer's forward and backward, timed through torch's profiler hooks (the backward of an operation "
         "belongs to the layer that ran its forward).</p><table class=\"phases\"><tr><th>layer</th><th "
         "class=\"num\">forward ms/step</th><th class=\"num\">backward ms/step</th><th class=\"num\">share of "
         "step time</th></tr>" +
         rows + "</table></section>";
}

std::string curves_html(const std::vector<RunView>& runs) {
  const bool compare = runs.size() > 1;
  std::string out = "<section class=\"curves\"><h2>Curves</h2><div class=\"charts\">";
  for (const auto& spec : chart_specs()) {
    std::vector<Series> series;
    for (const auto& r : runs) {
      for (const auto& [type, key] : spec.series) {
        Series s;
        s.id = fmt::format("{}.{}", type, key);
        s.run = r.label;
        s.dashed = std::string(type) == "eval";
        s.colour = compare ? r.colour : (s.dashed ? (s.id.size() > 4 && s.id.compare(s.id.size() - 4, 4, "_ema") == 0
                                                         ? kEmaColour
                                                         : kEvalColour)
                                                  : kTrainColour);
        s.label = series_label(type, key);
        s.points = extract(r.records(), type, key);
        series.push_back(std::move(s));
      }
    }
    const bool any = std::any_of(series.begin(), series.end(), [](const Series& s) { return !s.points.empty(); });
    if (spec.only_with_data && !any) continue;
    out += chart(spec.title, spec.y_title, series, compare);
  }
  return out + "</div></section>";
}

// Base64 (RFC 4648) for the inline PNG: a dozen lines, where no library the build has offers it.
std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += n > 1 ? kAlphabet[(v >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// A detector's test images with true (white) and predicted boxes, inline (the page has no URL).
std::string eval_images_html(const RunView& r) {
  if (r.data->eval_images_png.empty()) return "";
  return "<section class=\"eval-images\"><h2>Test images</h2><p class=\"muted\">the first test images after "
         "training: true boxes white, the best 10 detections scoring 0.4 or more in their class's colour with their score "
         "(every detection is in the PNG's crucible.eval_boxes chunk)</p><img alt=\"test images with boxes\" "
         "style=\"max-width:100%;image-rendering:pixelated\" src=\"data:image/png;base64," +
         base64(r.data->eval_images_png) + "\"></section>";
}

std::string config_html(const RunView& r, const std::vector<TomlEntry>& defaults) {
  const auto entries = flat_toml(r.data->config_toml, r.data->dir + "/config.toml");
  int changed = 0;
  std::string rows;
  for (const auto& e : entries) {
    const TomlEntry* d = find_entry(defaults, e.key);
    const bool differs = d != nullptr && !same_value(e, *d);
    changed += differs;
    rows += fmt::format("<tr{}><td class=\"key\">{}</td><td class=\"val\">{}</td><td class=\"def\">{}</td></tr>",
                        differs ? " class=\"changed\"" : "", esc(e.key), esc(e.text),
                        differs ? esc(d->text) : std::string());
  }
  return fmt::format(
      "<section class=\"config\"><h2>Configuration</h2><p class=\"muted\">config.toml as resolved; "
      "{} key{} from the default job (highlighted, with the default).</p><table><tr><th>key</th>"
      "<th>value</th><th>default</th></tr>{}</table></section>",
      changed, changed == 1 ? " differs" : "s differ", rows);
}

constexpr const char* kEnvKeys[] = {"torch_version", "crucible_version",   "threads", "world_size", "precision",
                                    "memory_format", "host_reads_per_step"};

std::string environment_html(const RunView& r) {
  const Json* s = r.summary();
  std::string out = "<section class=\"environment\"><h2>Environment</h2>";
  if (s == nullptr) return out + "<p class=\"muted\">recorded in summary.json when the run ends</p></section>";
  out += "<div class=\"cols\"><table><tr><th>field</th><th>value</th></tr>";
  for (const char* k : kEnvKeys) {
    if (const Json* v = field(s, k)) out += fmt::format("<tr><td>{}</td><td>{}</td></tr>", k, esc(json_text(*v)));
  }
  out += "</table>";
  const Json* env = field(s, "environment");
  if (env != nullptr && env->is_object() && !env->empty()) {
    out += "<table><tr><th>environment</th><th>value</th></tr>";
    for (auto it = env->begin(); it != env->end(); ++it) {
      out += fmt::format("<tr><td>{}</td><td>{}</td></tr>", esc(it.key()), esc(json_text(it.value())));
    }
    out += "</table>";
  }
  out += "</div>";
  const Json* doctor = field(s, "doctor");
  if (doctor != nullptr && doctor->is_object()) doctor = field(doctor, "checks");  // doctor's own JSON
  if (doctor != nullptr && doctor->is_array() && !doctor->empty()) {
    out +=
        "<h2 style=\"margin-top:16px\">Doctor</h2><table class=\"doctor\"><tr><th>check</th><th>status</th>"
        "<th>found</th><th>fix</th></tr>";
    for (const auto& c : *doctor) {
      const std::string st = string_at(&c, "status");
      const char* cls = st == "ok" ? "ok" : st == "warn" ? "warn" : st == "fail" ? "fail" : "";
      out += fmt::format("<tr><td>{}</td><td><span class=\"badge {}\">{}</span></td><td>{}</td><td>{}</td></tr>",
                         esc(num_or_dash(&c, "name")), cls, esc(st), esc(string_at(&c, "found")),
                         esc(string_at(&c, "fix")));
    }
    out += "</table>";
  }
  return out + "</section>";
}

std::string files_html(const RunView& r) {
  const Json* s = r.summary();
  std::string out = "<section class=\"files\"><div class=\"cols\"><div><h2>Skipped samples</h2>";
  double skipped = 0;
  if (number_at(s, "bad_samples_skipped", &skipped)) {
    out +=
        fmt::format("<p>{} sample{} skipped as unreadable or undecodable.</p>", num(skipped), skipped == 1 ? "" : "s");
    const Json* names = field(s, "skipped_samples");
    if (names != nullptr && names->is_array() && !names->empty()) {
      out += "<ul class=\"files\">";
      size_t shown = 0;
      for (const auto& n : *names) {
        if (++shown > 200) break;
        out += fmt::format("<li>{}</li>", esc(json_text(n)));
      }
      out += "</ul>";
      if (names->size() > 200) out += fmt::format("<p class=\"muted\">… and {} more</p>", names->size() - 200);
    }
  } else {
    out += "<p class=\"muted\">counted in summary.json when the run ends</p>";
  }
  out += "</div><div><h2>Checkpoints</h2>";
  if (r.data->checkpoints.empty()) {
    out += "<p class=\"muted\">none</p>";
  } else {
    out += "<ul class=\"files\">";
    for (const auto& c : r.data->checkpoints) out += fmt::format("<li>{}</li>", esc(c));
    out += "</ul>";
  }
  out += "</div></div>";
  if (r.data->torn_last_line) {
    out +=
        "<p class=\"muted\">metrics.jsonl ends in a half-written line (a write in progress, or cut by a crash); "
        "it is left out.</p>";
  }
  return out + "</section>";
}

// ---- comparison pieces --------------------------------------------------------------------------

std::string compare_header_html(const std::vector<RunView>& runs) {
  std::string out = fmt::format(
      "<header class=\"top\"><h1>Comparison of {} runs</h1><div class=\"sub\">crucible {}"
      "</div><table style=\"margin-top:12px\"><tr><th>run</th><th class=\"num\">test acc</th>"
      "<th class=\"num\">test loss</th><th class=\"num\">steps</th><th class=\"num\">"
      "samples/s</th><th>bottleneck</th><th>params sha256</th></tr>",
      runs.size(), CRUCIBLE_VERSION);
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunView& r = runs[i];
    const Json* s = r.summary();
    Verdict v;
    const std::string verdict = verdict_of(r, &v) ? fmt::format(
                                                        "<span id=\"verdict-{}\" class=\"verdict-small\" "
                                                        "data-run=\"{}\">{}</span>",
                                                        i, esc(r.label), esc(v.verdict))
                                                  : std::string("—");
    const std::string sha = num_or_dash(s, "params_sha256");
    out += fmt::format(
        "<tr><td><i class=\"box\" style=\"background:{}\"></i><b>{}</b>{}</td><td class=\"num\">{}"
        "</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td>"
        "<td class=\"val\"><code title=\"{}\">{}</code></td></tr>",
        r.colour, esc(r.label), s == nullptr ? " <span class=\"badge inprogress\">in progress</span>" : "",
        esc(pct_or_dash(s, "test_acc")), esc(num_or_dash(s, "test_loss")), esc(num_or_dash(s, "steps")),
        esc(num_or_dash(s, "samples_per_s")), verdict, esc(sha), esc(sha.size() > 16 ? sha.substr(0, 16) + "…" : sha));
  }
  return out + "</table></header>";
}

std::string compare_breakdown_html(const std::vector<RunView>& runs) {
  std::string rows;
  std::vector<std::string> legend;
  for (const auto& r : runs) {
    const auto phases = phases_of(r.summary());
    if (phases.empty()) continue;
    for (size_t i = 0; i < phases.size(); ++i) {
      const std::string item = fmt::format("<span><i class=\"box\" style=\"background:{}\"></i>{}</span>",
                                           phase_colour(phases[i].first, i), esc(phases[i].first));
      if (std::find(legend.begin(), legend.end(), item) == legend.end()) legend.push_back(item);
    }
    double step_s = 0;
    const bool has_step = number_at(field(r.summary(), "breakdown"), "step_seconds", &step_s);
    rows += fmt::format(
        "<tr><td style=\"width:18%\"><i class=\"box\" style=\"background:{}\"></i>{}{}</td>"
        "<td>{}</td></tr>",
        r.colour, esc(r.label), has_step ? fmt::format(" <span class=\"muted\">{} s</span>", num(step_s)) : "",
        stacked_bar(phases));
  }
  if (rows.empty()) return "";
  std::string out = "<section class=\"breakdown\"><h2>Where the step time goes</h2><div class=\"legend\">";
  for (const auto& l : legend) out += l;
  return out + "</div><table>" + rows + "</table></section>";
}

std::string compare_config_html(const std::vector<RunView>& runs, const std::vector<TomlEntry>& defaults) {
  std::vector<std::vector<TomlEntry>> flat;
  std::vector<std::string> keys;
  for (const auto& r : runs) {
    flat.push_back(flat_toml(r.data->config_toml, r.data->dir + "/config.toml"));
    for (const auto& e : flat.back()) {
      if (std::find(keys.begin(), keys.end(), e.key) == keys.end()) keys.push_back(e.key);
    }
  }
  std::string out =
      "<section class=\"config\"><h2>Configuration: keys that differ between the runs</h2>"
      "<table><tr><th>key</th>";
  for (const auto& r : runs) out += fmt::format("<th>{}</th>", esc(r.label));
  out += "<th>default</th></tr>";
  int shown = 0;
  for (const auto& key : keys) {
    std::vector<const TomlEntry*> vals;
    bool all_same = true;
    for (const auto& f : flat) {
      vals.push_back(find_entry(f, key));
      const TomlEntry *a = vals.front(), *b = vals.back();
      if ((a == nullptr) != (b == nullptr) || (a != nullptr && !same_value(*a, *b))) all_same = false;
    }
    if (all_same) continue;
    ++shown;
    const TomlEntry* d = find_entry(defaults, key);
    out += fmt::format("<tr><td class=\"key\">{}</td>", esc(key));
    for (const TomlEntry* v : vals) {
      const bool differs = v != nullptr && d != nullptr && !same_value(*v, *d);
      out += fmt::format("<td class=\"val{}\">{}</td>", differs ? " changed" : "", v ? esc(v->text) : "—");
    }
    out += fmt::format("<td class=\"def\">{}</td></tr>", d ? esc(d->text) : "");
  }
  out += "</table>";
  if (shown == 0) out += "<p class=\"muted\">the runs share every config key</p>";
  return out + "</section>";
}

std::string compare_environment_html(const std::vector<RunView>& runs) {
  std::string out = "<section class=\"environment\"><h2>Environment</h2><table><tr><th>field</th>";
  for (const auto& r : runs) out += fmt::format("<th>{}</th>", esc(r.label));
  out += "</tr>";
  for (const char* k : kEnvKeys) {
    out += fmt::format("<tr><td>{}</td>", k);
    for (const auto& r : runs) out += fmt::format("<td>{}</td>", esc(num_or_dash(r.summary(), k)));
    out += "</tr>";
  }
  out += "<tr><td>bad_samples_skipped</td>";
  for (const auto& r : runs) out += fmt::format("<td>{}</td>", esc(num_or_dash(r.summary(), "bad_samples_skipped")));
  out += "</tr><tr><td>checkpoints</td>";
  for (const auto& r : runs) out += fmt::format("<td>{}</td>", r.data->checkpoints.size());
  return out + "</tr></table></section>";
}

std::string page(const std::string& title, const std::string& body) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>{}</title><style>{}</style></head>\n<body><div class=\"page\">\n{}"
      "<footer>crucible {} run report · self-contained: no script, no external resource</footer>"
      "</div></body></html>\n",
      esc(title), kStyle, body, CRUCIBLE_VERSION);
}

}  // namespace

RunReportData load_run_report_data(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    throw bad_input(
        "{}: no such run folder (expected a folder with metrics.jsonl and config.toml, as `crucible "
        "train` writes)",
        run_dir);
  }
  RunReportData d;
  d.dir = run_dir;
  d.name = fs::path(run_dir).lexically_normal().filename().string();
  if (d.name.empty()) d.name = fs::path(run_dir).lexically_normal().parent_path().filename().string();

  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::is_regular_file(metrics_path, ec)) {
    throw bad_input("{}: missing (expected the run's metrics, one JSON object per line)", metrics_path);
  }
  const std::string text = read_file(metrics_path);
  auto records = std::make_shared<Json>(Json::array());
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const bool complete = end != std::string::npos;
    const std::string line = text.substr(pos, complete ? end - pos : std::string::npos);
    pos = complete ? end + 1 : text.size();
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::parse_error& e) {
      if (!complete) {  // a write in progress, or the torn tail of a crash
        d.torn_last_line = true;
        break;
      }
      const std::string what = e.what();
      const size_t at = what.find("parse error");
      throw bad_input("{}:{}: expected one JSON object per line, found text that is not JSON ({}): {}", metrics_path,
                      line_no, at == std::string::npos ? what : what.substr(at),
                      line.size() > 60 ? line.substr(0, 60) + "…" : line);
    }
    if (!j.is_object()) {
      throw bad_input("{}:{}: expected one JSON object per line, found a JSON {}", metrics_path, line_no,
                      j.type_name());
    }
    records->push_back(std::move(j));
  }
  d.records = std::move(records);

  const std::string summary_path = (fs::path(run_dir) / "summary.json").string();
  if (fs::exists(summary_path, ec)) {
    auto s = std::make_shared<Json>();
    try {
      *s = Json::parse(read_file(summary_path));
    } catch (const Json::parse_error& e) {
      throw bad_input("{}: not valid JSON ({}); expected the summary `crucible train` writes when a run ends",
                      summary_path, e.what());
    }
    if (!s->is_object()) {
      throw bad_input("{}: expected a JSON object, found a JSON {}", summary_path, s->type_name());
    }
    d.summary = std::move(s);
  }

  const std::string config_path = (fs::path(run_dir) / "config.toml").string();
  if (!fs::is_regular_file(config_path, ec)) {
    throw bad_input("{}: missing (expected the run's resolved config, as `crucible train` writes it)", config_path);
  }
  d.config_toml = read_file(config_path);
  parse_toml(d.config_toml, config_path, "the run's resolved config");

  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";
  if (fs::is_directory(ckpt_dir, ec)) {
    for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file(ec) && !is_atomic_temp_name(name)) d.checkpoints.push_back(name);
    }
    std::sort(d.checkpoints.begin(), d.checkpoints.end());
  }
  const std::string images = (fs::path(run_dir) / "eval_images.png").string();
  if (fs::is_regular_file(images, ec)) d.eval_images_png = read_file(images);
  return d;
}

std::string render_report(const std::vector<RunReportData>& runs, const std::string& defaults_toml) {
  if (runs.empty()) throw bad_input("report: no run to render");
  const std::vector<TomlEntry> defaults = flat_toml(defaults_toml, "the default job's config");
  std::vector<RunView> views;
  std::multiset<std::string> names;
  for (const auto& r : runs) names.insert(r.name);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].records == nullptr)
      throw bad_input("report: run {} has no records (load it with load_run_report_data)", runs[i].dir);
    views.push_back({&runs[i], names.count(runs[i].name) > 1 ? runs[i].dir : runs[i].name, run_colour(i)});
  }
  if (views.size() == 1) {
    const RunView& r = views.front();
    return page(r.label + " · crucible run report", header_html(r) + verdict_html(r) + breakdown_html(r) +
                                                        io_html(r) + layers_html(r) + curves_html(views) +
                                                        eval_images_html(r) + config_html(r, defaults) +
                                                        environment_html(r) + files_html(r));
  }
  std::string title = "crucible comparison:";
  for (const auto& v : views) title += " " + v.label;
  return page(title, compare_header_html(views) + curves_html(views) + compare_breakdown_html(views) +
                         compare_config_html(views, defaults) + compare_environment_html(views));
}

std::string write_run_report(const std::string& run_dir, const std::string& defaults_toml) {
  const std::string html = render_report({load_run_report_data(run_dir)}, defaults_toml);
  const std::string path = (fs::path(run_dir) / "report.html").string();
  write_file_atomic(path, html);
  return path;
}

}  // namespace crucible::obs
