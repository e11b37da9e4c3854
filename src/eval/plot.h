#pragma once
// Plots as standalone SVG files (no dependencies; open in any browser): line charts (loss curves,
// loss by position, scaling fits) and heatmaps (NIAH depth x length, retrieval heads layer x head).
#include <string>
#include <vector>

namespace hlm {

struct Series {
  std::string label;
  std::vector<double> x, y;
  bool points_only = false;  // scatter (measured points) instead of a line (fits)
  int color = -1;            // palette index; -1 = the series' position (same index = same colour)
};

struct LinePlot {
  std::string title, xlabel, ylabel;
  bool log_x = false, log_y = false;
  std::vector<Series> series;
};

struct Heatmap {
  std::string title, xlabel, ylabel;
  std::vector<std::string> col_labels, row_labels;
  std::vector<std::vector<double>> values;  // [rows][cols]; NaN = no data (grey)
  double vmin = 0, vmax = 1;
  bool annotate = true;  // print the value in each cell
};

// Grouped bars (e.g. NIAH per hybrid with no / full / efficient layers capped), with optional min..max
// whiskers (the spread over seeds).
struct BarChart {
  std::string title, ylabel;
  std::vector<std::string> groups;                   // along x
  std::vector<std::string> series;                   // one bar per series in each group (legend)
  std::vector<std::vector<double>> values, lo, hi;   // [series][group]; lo/hi may be empty; NaN = no bar
  double ymin = 0, ymax = 1;
};

// Throws hlm::Error when the file cannot be written or the extension is not .svg.
void write_line_plot(const LinePlot& p, const std::string& path);
void write_heatmap(const Heatmap& h, const std::string& path);
void write_bar_chart(const BarChart& b, const std::string& path);

}  // namespace hlm
