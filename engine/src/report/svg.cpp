// The transient report chart: the roofline (left) beside the cold start / restore / migration
// wall-clock bars, per stage (right). Plain SVG 1.1: no scripts, fonts or images from outside,
// and deterministic (same report, same bytes), so charts can be diffed and tested.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numbers>
#include <sstream>
#include <vector>

#include "gpuckpt/report.h"
#include "gpuckpt/support.h"
#include "report/format.h"

namespace gpuckpt {

using namespace report;

namespace {

constexpr double kWidth = 1200;
// Left panel: the roofline plot area.
constexpr double kPx0 = 80, kPx1 = 540, kPy0 = 86, kPy1 = 420;
// Right panel.
constexpr double kRx0 = 620, kRx1 = 1170;
constexpr double kBarH = 28, kLaneH = 8, kLaneGap = 2;
constexpr int kMaxLanes = 4;
constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";

// Rough width of a label in the sans-serif fonts used (for layout only).
double text_width(const std::string& s, double size) {
  return static_cast<double>(s.size()) * size * 0.6;
}

// Time-axis tick: "0", "250 ms", "10 s", "1.5 s".
std::string tick_seconds(double v) {
  char b[32];
  if (v == 0) return "0";
  if (v < 1) {
    std::snprintf(b, sizeof b, "%g ms", std::round(v * 1e6) / 1e3);
  } else {
    std::snprintf(b, sizeof b, "%g s", std::round(v * 1e3) / 1e3);
  }
  return b;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

class Svg {
 public:
  std::ostringstream o;
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double w,
            const std::string& extra = "") {
    o << "<line x1=\"" << num(x1) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x2) << "\" y2=\""
      << num(y2) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << num(w) << "\"" << extra
      << "/>\n";
  }
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& extra = "", const std::string& title = "") {
    o << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\""
      << num(h) << "\" fill=\"" << fill << "\"" << extra;
    if (title.empty()) {
      o << "/>\n";
    } else {
      o << "><title>" << xml_escape(title) << "</title></rect>\n";
    }
  }
  void text(double x, double y, const std::string& s, double size, const std::string& extra = "") {
    o << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" font-size=\"" << num(size) << "\""
      << extra << ">" << xml_escape(s) << "</text>\n";
  }
  void circle(double x, double y, double r, const std::string& fill,
              const std::string& extra = "") {
    o << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"" << num(r) << "\" fill=\""
      << fill << "\"" << extra << "/>\n";
  }
};

// ---- Roofline panel ----------------------------------------------------------------------

std::string decade_label(int e) {
  static const char* big[] = {"1", "10", "100", "1k", "10k", "100k", "1M", "10M", "100M", "1G"};
  if (e >= 0 && e <= 9) return big[e];
  if (e < 0 && e >= -4) {
    std::string s = "0.";
    for (int i = 1; i < -e; ++i) s += '0';
    return s + "1";
  }
  return "1e" + std::to_string(e);
}

struct LogAxis {
  int lo = 0, hi = 1;     // decades
  double p0 = 0, p1 = 1;  // pixels for 10^lo and 10^hi
  double at(double v) const { return p0 + (std::log10(v) - lo) / (hi - lo) * (p1 - p0); }
  double min() const { return std::pow(10.0, lo); }
  double max() const { return std::pow(10.0, hi); }
};

// The roofline's ceilings and the log axes that frame them (and the workload, if any).
struct RoofPlot {
  double bw = 0, peak = 0, ridge = 0;
  double tensor = 0, tensor_ridge = 0;  // a tensor ceiling is drawn only above FP32 (0: none)
  LogAxis x, y;

  explicit RoofPlot(const TransientReport& r) {
    const Ceilings& c = r.ceilings;
    bw = c.bandwidth_gbps;
    peak = c.fp32_gflops;
    ridge = c.ridge_point();
    tensor = c.tensor_gflops && *c.tensor_gflops > peak ? *c.tensor_gflops : 0;
    tensor_ridge = tensor > 0 ? tensor / bw : ridge;
    // Axes: whole decades, from a decade below the leftmost point of interest to one above the
    // rightmost; at least three decades wide.
    double xlo = std::min(ridge, tensor_ridge), xhi = std::max(ridge, tensor_ridge);
    if (r.workload) {
      xlo = std::min(xlo, r.workload->intensity);
      xhi = std::max(xhi, r.workload->intensity);
    }
    x = LogAxis{static_cast<int>(std::floor(std::log10(xlo))) - 1,
                static_cast<int>(std::ceil(std::log10(xhi))) + 1, kPx0, kPx1};
    if (x.hi - x.lo < 3) x.hi = x.lo + 3;
    const double ytop = std::max(tensor, peak);
    y = LogAxis{0, static_cast<int>(std::ceil(std::log10(ytop * 1.5))), kPy1, kPy0};
    double ybottom = bw * x.min();
    if (r.workload && r.workload->achieved_gflops && *r.workload->achieved_gflops > 0)
      ybottom = std::min(ybottom, *r.workload->achieved_gflops);
    y.lo = std::max(static_cast<int>(std::floor(std::log10(ybottom))), y.hi - 8);
    if (y.hi - y.lo < 3) y.lo = y.hi - 3;
  }
};

void roofline_grid(Svg& s, const LogAxis& x, const LogAxis& y) {
  for (int e = x.lo; e <= x.hi; ++e) {
    const double px = x.at(std::pow(10.0, e));
    if (e > x.lo && e < x.hi) s.line(px, kPy0, px, kPy1, "#e6e6e6", 1);
    s.line(px, kPy1, px, kPy1 + 6, "#444444", 1);
    s.text(px, kPy1 + 20, decade_label(e), 12, " text-anchor=\"middle\"");
    for (int m = 2; m <= 9 && e < x.hi; ++m) {
      const double pm = x.at(m * std::pow(10.0, e));
      s.line(pm, kPy1, pm, kPy1 + 3, "#444444", 1);
    }
  }
  for (int e = y.lo; e <= y.hi; ++e) {
    const double py = y.at(std::pow(10.0, e));
    if (e > y.lo && e < y.hi) s.line(kPx0, py, kPx1, py, "#e6e6e6", 1);
    s.line(kPx0 - 6, py, kPx0, py, "#444444", 1);
    s.text(kPx0 - 9, py + 4, decade_label(e), 12, " text-anchor=\"end\"");
    for (int m = 2; m <= 9 && e < y.hi; ++m) {
      const double pm = y.at(m * std::pow(10.0, e));
      s.line(kPx0 - 3, pm, kPx0, pm, "#444444", 1);
    }
  }
  s.text((kPx0 + kPx1) / 2, kPy1 + 42, "arithmetic intensity (FLOP/byte)", 13,
         " text-anchor=\"middle\"");
  s.text(26, (kPy0 + kPy1) / 2, "performance (GFLOP/s)", 13,
         " text-anchor=\"middle\" transform=\"rotate(-90 26 " + num((kPy0 + kPy1) / 2) + ")\"");
}

// The roof: bandwidth slope up to the ridge, FP32 ceiling to the right of it; the tensor
// ceiling (GPU) above, reached by the dashed continuation of the slope.
void roofline_roof(Svg& s, const RoofPlot& g, const std::optional<RooflinePlacement>& workload) {
  const LogAxis &x = g.x, &y = g.y;
  const double bw = g.bw, peak = g.peak, ridge = g.ridge, tensor = g.tensor,
               tensor_ridge = g.tensor_ridge;
  const double xa = std::max(x.min(), y.min() / bw);
  const std::string roof = "#1f4e79", tensor_colour = "#7b3294";
  s.line(x.at(xa), y.at(bw * xa), x.at(ridge), y.at(peak), roof, 3, " stroke-linecap=\"round\"");
  s.line(x.at(ridge), y.at(peak), kPx1, y.at(peak), roof, 3, " stroke-linecap=\"round\"");
  if (tensor > 0) {
    s.line(x.at(ridge), y.at(peak), x.at(tensor_ridge), y.at(tensor), tensor_colour, 2,
           " stroke-dasharray=\"6 4\"");
    s.line(x.at(tensor_ridge), y.at(tensor), kPx1, y.at(tensor), tensor_colour, 2,
           " stroke-dasharray=\"6 4\"");
  }
  // Slope label, rotated along the slope, on the part of it away from the workload's point.
  {
    const double x1 = x.at(xa), y1 = y.at(bw * xa), x2 = x.at(ridge), y2 = y.at(peak);
    const double angle = std::atan2(y2 - y1, x2 - x1) * 180 / std::numbers::pi;
    double f = 0.45;
    if (workload && x2 > x1) {
      const double wf = (x.at(workload->intensity) - x1) / (x2 - x1);
      if (wf > -0.1 && wf < 1.1) f = wf > 0.5 ? 0.25 : 0.75;
    }
    const double lx = x1 + f * (x2 - x1), ly = y1 + f * (y2 - y1) - 8;
    s.text(lx, ly, "memory " + fmt_gbps(bw), 12,
           " text-anchor=\"middle\" fill=\"" + roof + "\" transform=\"rotate(" + num(angle) + " " +
               num(lx) + " " + num(ly) + ")\"");
  }
  double fp32_label_y = y.at(peak) - 7;
  if (tensor > 0) {
    const double ty = y.at(tensor);
    s.text(kPx1 - 6, ty - 7, "tensor peak " + fmt_gflops(tensor), 12,
           " text-anchor=\"end\" fill=\"" + tensor_colour + "\"");
    if (fp32_label_y - (ty - 7) < 16) fp32_label_y = y.at(peak) + 17;  // keep labels apart
  }
  s.text(kPx1 - 6, fp32_label_y, "FP32 peak " + fmt_gflops(peak), 12,
         " text-anchor=\"end\" fill=\"" + roof + "\"");
  // Ridge point.
  s.line(x.at(ridge), y.at(peak), x.at(ridge), kPy1, "#999999", 1, " stroke-dasharray=\"2 3\"");
  s.text(x.at(ridge) + 4, kPy1 - 6, "ridge " + fmt_intensity(ridge), 11, " fill=\"#666666\"");
}

// The workload's point (and its attainable point on the roof), with three lines of text.
void roofline_workload(Svg& s, const RoofPlot& g, const RooflinePlacement& w) {
  const LogAxis &x = g.x, &y = g.y;
  const double clamp_lo = y.min();
  const double wx = x.at(w.intensity);
  const double roof_y = y.at(std::max(w.attainable_gflops, clamp_lo));
  double point_y = roof_y;
  const std::string red = "#c0392b";
  if (w.achieved_gflops) {
    point_y = y.at(std::max(*w.achieved_gflops, clamp_lo));
    s.line(wx, roof_y, wx, point_y, red, 1.5, " stroke-dasharray=\"3 3\"");
    s.circle(wx, roof_y, 5, "#ffffff", " stroke=\"" + red + "\" stroke-width=\"2\"");
  }
  s.circle(wx, point_y, 6, red);
  // Three short lines beside the point, on the side with room for them.
  const std::string name = w.label.empty() ? "workload" : w.label;
  const double shown = w.achieved_gflops ? *w.achieved_gflops : w.attainable_gflops;
  const std::vector<std::string> lines = {
      name,
      fmt_intensity(w.intensity) + ", " + fmt_gflops(shown) +
          (w.achieved_gflops ? " achieved" : " attainable"),
      std::string(w.memory_bound ? "memory-bound" : "compute-bound") + ", attainable " +
          fmt_gflops(w.attainable_gflops)};
  double width = 0;
  for (const auto& l : lines) width = std::max(width, text_width(l, 11.5));
  bool right = wx + 10 + width <= kPx1 - 4;
  double tx = right ? wx + 10 : wx - 10;
  if (!right && wx - 10 - width < kPx0 + 4) {  // no room either side: the roomier edge
    right = wx - kPx0 < kPx1 - wx;
    tx = right ? kPx0 + 4 : kPx1 - 4;
  }
  const double ty = std::clamp(point_y + 22, kPy0 + 14, kPy1 - 40);
  const std::string anchor = right ? " text-anchor=\"start\"" : " text-anchor=\"end\"";
  s.text(tx, ty, lines[0], 12, anchor + " fill=\"" + red + "\" font-weight=\"bold\"");
  s.text(tx, ty + 15, lines[1], 11, anchor + " fill=\"" + red + "\"");
  s.text(tx, ty + 29, lines[2], 11, anchor + " fill=\"" + red + "\"");
}

void roofline_panel(Svg& s, const TransientReport& r) {
  const Ceilings& c = r.ceilings;
  s.text(kPx0, kPy0 - 16,
         c.target.empty() ? "roofline" : "roofline: " + c.device_name + " (" + c.target + ")", 15,
         " font-weight=\"bold\"");
  s.rect(kPx0, kPy0, kPx1 - kPx0, kPy1 - kPy0, "#ffffff", " stroke=\"#888888\"");
  if (c.target.empty() || !(c.bandwidth_gbps > 0) || !(c.fp32_gflops > 0)) {
    s.text((kPx0 + kPx1) / 2, (kPy0 + kPy1) / 2, "roofline not measured", 14,
           " text-anchor=\"middle\" fill=\"#666666\"");
    s.text((kPx0 + kPx1) / 2, (kPy0 + kPy1) / 2 + 20,
           "(gpuckpt report --roofline FILE or --measure)", 12,
           " text-anchor=\"middle\" fill=\"#666666\"");
    return;
  }
  const RoofPlot g(r);
  roofline_grid(s, g.x, g.y);
  roofline_roof(s, g, r.workload);
  if (r.workload) roofline_workload(s, g, *r.workload);
  // How the ceilings were measured, in small print.
  std::string how = c.method;
  if (how.size() > 100) how = how.substr(0, 97) + "...";
  if (!how.empty()) s.text(kPx0 - 60, kPy1 + 64, "measured: " + how, 10, " fill=\"#666666\"");
}

// ---- Wall-clock bars panel ---------------------------------------------------------------

struct Row {
  std::string title;
  const std::optional<Timeline>* timeline;
  const FloorContext* context;
};

// Stage colours: fixed for the stages every bar shares, then by first appearance, so one name
// has one colour across the whole chart.
class Palette {
 public:
  Palette() { fixed_ = {{"spawn", "#9c755f"}, {"ready", "#4e79a7"}, {"first_answer", "#59a14f"}}; }
  std::string operator()(const std::string& name) {
    if (auto it = fixed_.find(name); it != fixed_.end()) return it->second;
    if (auto it = assigned_.find(name); it != assigned_.end()) return it->second;
    static const char* colours[] = {
        "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac", "#17becf",
        "#bcbd22", "#8c564b", "#1f77b4", "#aec7e8", "#98df8a", "#c5b0d5", "#7f7f7f", "#d62728",
        "#9467bd", "#e377c2", "#843c39", "#637939", "#3182bd", "#de9ed6", "#fdae6b", "#31a354"};
    const std::string c = colours[assigned_.size() % std::size(colours)];
    assigned_[name] = c;
    return c;
  }

 private:
  std::map<std::string, std::string> fixed_, assigned_;
};

// Stages that overlap go to further lanes (sub-stages under their parent, pipelined stages
// side by side). Returns the lane of every stage, -1 if beyond kMaxLanes.
std::vector<int> assign_lanes(const std::vector<Stage>& stages, int& lanes_used) {
  std::vector<size_t> order(stages.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (stages[a].start_offset != stages[b].start_offset)
      return stages[a].start_offset < stages[b].start_offset;
    return stages[a].seconds > stages[b].seconds;  // the enclosing stage first
  });
  std::vector<double> lane_end;
  std::vector<int> lane(stages.size(), -1);
  for (size_t i : order) {
    const double start = stages[i].start_offset, end = start + stages[i].seconds;
    int l = 0;
    while (l < static_cast<int>(lane_end.size()) && lane_end[l] > start + 1e-9) ++l;
    if (l >= kMaxLanes) continue;
    if (l == static_cast<int>(lane_end.size())) lane_end.push_back(end);
    lane_end[l] = end;
    lane[i] = l;
  }
  lanes_used = std::max<int>(1, static_cast<int>(lane_end.size()));
  return lane;
}

// Linear time-axis step: 1, 2 or 5 x 10^k, giving at most ~6 ticks.
double nice_step(double span) {
  const double raw = span / 5;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

double bars_panel(Svg& s, const TransientReport& r) {
  s.text(kRx0, kPy0 - 16, "time to serve (wall clock, per stage)", 15, " font-weight=\"bold\"");
  const std::vector<Row> rows = {
      {"cold start: decision \u2192 first token", &r.cold_start, &r.cold_start_context},
      {"restore: interruption \u2192 serving", &r.restore, &r.restore_context},
      {"migration: decision \u2192 answering elsewhere", &r.migration, &r.migration_context}};
  double tmax = 0;
  for (const auto& row : rows)
    if (*row.timeline) tmax = std::max(tmax, (*row.timeline)->total_seconds());
  if (!(tmax > 0)) tmax = 1;
  const double bar_w = kRx1 - kRx0 - 90;  // room for the total after the longest bar
  const double scale = bar_w / tmax;

  Palette colour;
  std::vector<std::string> legend;  // stage names in order of appearance
  double yrow = kPy0 + 8;
  for (const auto& row : rows) {
    // The floor: the number's bytes through the path's slowest ceiling (a dashed mark).
    std::optional<Floor> floor;
    if (r.path && *row.timeline) floor = transient_floor(**row.timeline, *r.path, *row.context);
    std::string title = row.title;
    if (floor) {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.0f%%", floor->percent_of((*row.timeline)->total_seconds()));
      title +=
          "  (floor " + format_seconds(floor->seconds) + ", " + floor->bound + "; at " + pct + ")";
    }
    s.text(kRx0, yrow, title, 13);
    const double bar_y = yrow + 8;
    if (!*row.timeline) {
      s.rect(kRx0, bar_y, bar_w, kBarH, "#fafafa", " stroke=\"#dddddd\" stroke-dasharray=\"4 3\"");
      s.text(kRx0 + 10, bar_y + 19, "not measured", 12, " fill=\"#888888\"");
      yrow = bar_y + kBarH + 34;
      continue;
    }
    const Timeline& t = **row.timeline;
    const auto& stages = t.stages();
    int lanes = 1;
    const std::vector<int> lane = assign_lanes(stages, lanes);
    const double total = t.total_seconds();
    s.rect(kRx0, bar_y, total * scale, kBarH, "#eeeeee");  // gaps between stages show grey
    for (size_t i = 0; i < stages.size(); ++i) {
      const Stage& st = stages[i];
      if (std::find(legend.begin(), legend.end(), st.name) == legend.end())
        legend.push_back(st.name);
      if (lane[i] < 0) continue;
      const double y =
          lane[i] == 0 ? bar_y : bar_y + kBarH + kLaneGap + (lane[i] - 1) * (kLaneH + kLaneGap);
      const double h = lane[i] == 0 ? kBarH : kLaneH;
      s.rect(kRx0 + st.start_offset * scale, y, std::max(st.seconds * scale, 0.75), h,
             colour(st.name), "", st.name + ": " + format_seconds(st.seconds));
    }
    s.text(kRx0 + total * scale + 6, bar_y + 19, format_seconds(total), 13,
           " font-weight=\"bold\"");
    if (floor) {
      const double fx = kRx0 + std::min(floor->seconds, tmax) * scale;
      s.line(fx, bar_y - 4, fx, bar_y + kBarH + 4, "#a00000", 2, " stroke-dasharray=\"3 2\"");
    }
    yrow = bar_y + kBarH + (lanes - 1) * (kLaneH + kLaneGap) + 34;
  }

  // Time axis under the bars, with faint guides up through them.
  const double axis_y = yrow - 16;
  const double step = nice_step(tmax);
  s.line(kRx0, axis_y, kRx0 + bar_w, axis_y, "#444444", 1);
  for (double v = 0; v <= tmax * 1.0001; v += step) {
    const double px = kRx0 + v * scale;
    s.line(px, kPy0 + 12, px, axis_y, "#000000", 0.5, " stroke-opacity=\"0.12\"");
    s.line(px, axis_y, px, axis_y + 5, "#444444", 1);
    s.text(px, axis_y + 18, tick_seconds(v), 11, " text-anchor=\"middle\"");
  }

  // Legend: one colour per stage name, three columns.
  double ly = axis_y + 44;
  s.text(kRx0, ly, "stages", 12, " font-weight=\"bold\"");
  ly += 8;
  const double col_w = (kRx1 - kRx0) / 3;
  for (size_t i = 0; i < legend.size(); ++i) {
    const double lx = kRx0 + (i % 3) * col_w;
    const double y = ly + static_cast<double>(i / 3) * 18;
    s.rect(lx, y, 12, 12, colour(legend[i]));
    s.text(lx + 17, y + 10.5, legend[i], 12);
  }
  ly += static_cast<double>((legend.size() + 2) / 3) * 18 + 22;

  if (const auto sp = restore_speedup(r)) {
    s.text(kRx0, ly, speedup_sentence(*sp), 16, " font-weight=\"bold\" fill=\"#1f4e79\"");
    ly += 10;
  }
  return ly;
}

}  // namespace

std::string render_svg(const TransientReport& r) {
  Svg body;
  body.text(kPx0 - 60, 32, "gpuckpt transient report", 20, " font-weight=\"bold\"");
  roofline_panel(body, r);
  const double right_bottom = bars_panel(body, r);
  const double height = std::ceil(std::max(kPy1 + 80, right_bottom + 20));
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
    << "\" font-family=\"" << kFont << "\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << num(kWidth) << "\" height=\"" << num(height)
    << "\" fill=\"#ffffff\"/>\n";
  o << body.o.str() << "</svg>\n";
  return o.str();
}

std::string render_html(const TransientReport& r) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<title>gpuckpt transient report</title>\n<style>\n"
    << "body { font-family: " << kFont << "; margin: 24px; color: #222; }\n"
    << "svg { max-width: 100%; height: auto; }\n"
    << "pre { background: #f6f6f6; padding: 12px; overflow-x: auto; }\n"
    << "</style>\n</head>\n<body>\n"
    << render_svg(r) << "<h2>Numbers</h2>\n<pre>" << xml_escape(render_table(r)) << "</pre>\n"
    << "</body>\n</html>\n";
  return o.str();
}

}  // namespace gpuckpt
