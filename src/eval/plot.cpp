#include "eval/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace hlm {

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                         "#bcbd22", "#17becf"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

void save(const std::string& svg, const std::string& path) {
  if (path.size() < 4 || path.substr(path.size() - 4) != ".svg")
    fail("--plot {}: plots are written as SVG; use a file name ending in .svg", path);
  std::ofstream f(path);
  if (!f) fail("--plot {}: cannot write the file", path);
  f << svg;
}

std::string tick(double v) {
  if (v == 0) return "0";
  double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.2g}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  return fmt::format("{:.3g}", v);
}

// Viridis-like ramp from dark blue to yellow.
std::string color(double t) {
  if (!std::isfinite(t)) return "#cccccc";
  t = std::clamp(t, 0.0, 1.0);
  const double stops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  double s = t * 4;
  int i = std::min(3, static_cast<int>(s));
  double f = s - i;
  int rgb[3];
  for (int k = 0; k < 3; ++k) rgb[k] = static_cast<int>(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

// The document's opening: size, white background, the title centred at title_x (12-pt text, 15-pt title).
std::string svg_open(double W, double H, double title_x, const std::string& title) {
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", title_x, esc(title));
  return s;
}

}  // namespace

void write_line_plot(const LinePlot& p, const std::string& path) {
  const double W = 720, H = 460, L = 80, R = 190, Tm = 40, Bm = 60;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto tx = [&](double x) { return p.log_x ? std::log10(x) : x; };
  auto ty = [&](double y) { return p.log_y ? std::log10(y) : y; };
  for (auto& s : p.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if ((p.log_x && s.x[i] <= 0) || (p.log_y && s.y[i] <= 0)) continue;
      x0 = std::min(x0, tx(s.x[i]));
      x1 = std::max(x1, tx(s.x[i]));
      y0 = std::min(y0, ty(s.y[i]));
      y1 = std::max(y1, ty(s.y[i]));
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return Tm + (1 - (ty(y) - y0) / (y1 - y0)) * (H - Tm - Bm); };
  std::string s = svg_open(W, H, (L + W - R) / 2, p.title);
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", L, Tm,
                   W - L - R, H - Tm - Bm);
  for (int i = 0; i <= 5; ++i) {
    double vx = x0 + (x1 - x0) * i / 5, vy = y0 + (y1 - y0) * i / 5;
    double rx = p.log_x ? std::pow(10, vx) : vx, ry = p.log_y ? std::pow(10, vy) : vy;
    double X = px(rx), Y = py(ry);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#eee\"/>\n", X, Tm, H - Bm);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#eee\"/>\n", L, Y, W - R);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X, H - Bm + 16, tick(rx));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6, Y + 4, tick(ry));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2, H - 18,
                   esc(p.xlabel + (p.log_x ? " (log)" : "")));
  s += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                   (Tm + H - Bm) / 2, esc(p.ylabel + (p.log_y ? " (log)" : "")));
  for (size_t k = 0; k < p.series.size(); ++k) {
    const auto& se = p.series[k];
    const char* c = kColors[(se.color >= 0 ? static_cast<size_t>(se.color) : k) % 10];
    std::string pts;
    for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
      if (!std::isfinite(se.x[i]) || !std::isfinite(se.y[i])) continue;
      if ((p.log_x && se.x[i] <= 0) || (p.log_y && se.y[i] <= 0)) continue;
      if (se.points_only)
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(se.x[i]), py(se.y[i]), c);
      else
        pts += fmt::format("{:.1f},{:.1f} ", px(se.x[i]), py(se.y[i]));
    }
    if (!pts.empty())
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"/>\n", pts, c);
    const double ly = Tm + 14 + 18 * static_cast<double>(k);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{}\"/>\n", W - R + 12, ly - 4, c);
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 32, ly, esc(se.label));
  }
  s += "</svg>\n";
  save(s, path);
}

void write_heatmap(const Heatmap& h, const std::string& path) {
  const size_t rows = h.values.size(), cols = rows ? h.values[0].size() : 0;
  const double cell_w = std::max(28.0, std::min(64.0, 640.0 / std::max<size_t>(1, cols)));
  const double cell_h = std::max(18.0, std::min(40.0, 480.0 / std::max<size_t>(1, rows)));
  const double L = 110, Tm = 44, Bm = 64, R = 90;
  const double W = L + cell_w * cols + R, H = Tm + cell_h * rows + Bm;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", W / 2, esc(h.title));
  const double span = h.vmax > h.vmin ? h.vmax - h.vmin : 1;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      double v = h.values[r][c];
      double x = L + cell_w * c, y = Tm + cell_h * r;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", x, y, cell_w, cell_h,
                       color((v - h.vmin) / span));
      if (h.annotate && std::isfinite(v) && cell_w >= 28)
        s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\" font-size=\"10\">{}</text>\n",
                         x + cell_w / 2, y + cell_h / 2 + 4, (v - h.vmin) / span > 0.6 ? "black" : "white", tick(v));
    }
  for (size_t r = 0; r < rows && r < h.row_labels.size(); ++r)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6, Tm + cell_h * r + cell_h / 2 + 4,
                     esc(h.row_labels[r]));
  for (size_t c = 0; c < cols && c < h.col_labels.size(); ++c)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + cell_w * c + cell_w / 2,
                     Tm + cell_h * rows + 16, esc(h.col_labels[c]));
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + cell_w * cols / 2, H - 14,
                   esc(h.xlabel));
  s += fmt::format("<text x=\"16\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {0})\">{1}</text>\n",
                   Tm + cell_h * rows / 2, esc(h.ylabel));
  for (int i = 0; i <= 10; ++i) {  // colour bar
    double y = Tm + (cell_h * rows) * (10 - i) / 11.0;
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"16\" height=\"{}\" fill=\"{}\"/>\n", W - R + 20, y,
                     cell_h * rows / 11.0 + 1, color(i / 10.0));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 40, Tm + 10, tick(h.vmax));
  s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 40, Tm + cell_h * rows, tick(h.vmin));
  s += "</svg>\n";
  save(s, path);
}

void write_bar_chart(const BarChart& b, const std::string& path) {
  const size_t G = b.groups.size(), S = b.series.size();
  const double L = 70, R = 190, Tm = 40, Bm = 60, H = 400;
  const double group_w = std::max(60.0, 30.0 * static_cast<double>(S) + 20), W = L + group_w * G + R;
  const double span = b.ymax > b.ymin ? b.ymax - b.ymin : 1;
  auto py = [&](double v) { return Tm + (1 - (std::clamp(v, b.ymin, b.ymax) - b.ymin) / span) * (H - Tm - Bm); };
  std::string s = svg_open(W, H, (L + W - R) / 2, b.title);
  for (int i = 0; i <= 5; ++i) {
    const double v = b.ymin + span * i / 5, Y = py(v);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#eee\"/>\n", L, Y, W - R);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6, Y + 4, tick(v));
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", L, Tm,
                   W - L - R, H - Tm - Bm);
  const double bar_w = (group_w - 20) / std::max<size_t>(1, S);
  for (size_t g = 0; g < G; ++g) {
    const double gx = L + group_w * g + 10;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", gx + (group_w - 20) / 2,
                     H - Bm + 16, esc(b.groups[g]));
    for (size_t k = 0; k < S; ++k) {
      const double v = k < b.values.size() && g < b.values[k].size() ? b.values[k][g] : NAN;
      if (!std::isfinite(v)) continue;
      const double x = gx + bar_w * k, y = py(v), y0 = py(std::max(b.ymin, 0.0));
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x,
                       std::min(y, y0), bar_w - 2, std::fabs(y0 - y), kColors[k % 10]);
      if (k < b.lo.size() && k < b.hi.size() && g < b.lo[k].size() && g < b.hi[k].size() &&
          std::isfinite(b.lo[k][g]) && std::isfinite(b.hi[k][g]) && b.hi[k][g] > b.lo[k][g])
        s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#222\"/>\n",
                         x + (bar_w - 2) / 2, py(b.lo[k][g]), py(b.hi[k][g]));
    }
  }
  s += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                   (Tm + H - Bm) / 2, esc(b.ylabel));
  for (size_t k = 0; k < S; ++k) {
    const double ly = Tm + 14 + 18 * static_cast<double>(k);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"10\" fill=\"{}\"/>\n", W - R + 12, ly - 9,
                     kColors[k % 10]);
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 32, ly, esc(b.series[k]));
  }
  s += "</svg>\n";
  save(s, path);
}

}  // namespace hlm
