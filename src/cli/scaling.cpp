// hybridlm scaling fit RUN...: scaling-law fits over many training runs (docs/scaling.md). Runs are grouped
// by architecture; per group L(C) = E + A C^-alpha is fitted to the loss-vs-compute frontier, and
// Chinchilla L(N, D) to the runs' final points when there are >= 5 distinct (N, D); constants come with
// bootstrap intervals over runs, and an SVG shows points and fitted curves.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/timer.h"
#include "eval/plot.h"
#include "eval/scaling.h"

namespace hlm::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct FitOpts {
  std::vector<std::string> runs;
  std::string metric = "val_loss", group_by = "pattern", points = "frontier", params = "matmul", grid = "full";
  std::string plot;
  int bootstrap = 100;
  std::uint64_t seed = 0;
  bool json = false;
  int threads = 0;
};

// A run with what the sweep (if any) says about it.
struct RunRef {
  std::string dir;
  std::string sweep_arch;    // the plan's arch name when the run belongs to a sweep
  std::string sweep_status;  // "" when not part of a sweep
};

json read_sweep(const fs::path& p) {
  std::ifstream f(p);
  if (!f) fail("{}: cannot open", p.string());
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("{}: malformed JSON: {}", p.string(), e.what());
  }
  if (!j.is_object() || !j.contains("runs") || !j["runs"].is_array())
    fail("{}: field 'runs' must be an array (a sweep.json written by `hybridlm sweep`)", p.string());
  return j;
}

// The sweep entry of a run folder, from <run>/../sweep.json ({} when there is none).
json sweep_entry(const fs::path& run_dir) {
  const fs::path parent = fs::absolute(run_dir).lexically_normal().parent_path();
  const fs::path sj = parent / "sweep.json";
  if (!fs::exists(sj)) return json::object();
  json s = read_sweep(sj);
  const std::string name = fs::absolute(run_dir).lexically_normal().filename().string();
  for (auto& r : s["runs"])
    if (r.is_object() && r.value("name", std::string()) == name) return r;
  return json::object();
}

bool is_run_dir(const fs::path& p) { return fs::exists(p / "metrics.jsonl") || fs::exists(p / "config.json"); }

// Arguments -> run folders: a run folder; a sweep.json or a sweep folder (its runs); a folder of runs.
std::vector<RunRef> expand_runs(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  for (const auto& a : args) {
    const fs::path p(a);
    if (!fs::exists(p)) fail("{}: no such run folder", a);
    if (fs::is_regular_file(p)) {
      if (p.filename() != "sweep.json")
        fail("{}: not a run folder (give run folders, a sweep folder or its sweep.json)", a);
      json s = read_sweep(p);
      for (auto& r : s["runs"])
        if (r.is_object() && r.contains("name")) dirs.push_back((p.parent_path() / r["name"].get<std::string>()).string());
      continue;
    }
    if (is_run_dir(p)) {
      dirs.push_back(a);
      continue;
    }
    if (fs::exists(p / "sweep.json")) {
      json s = read_sweep(p / "sweep.json");
      for (auto& r : s["runs"])
        if (r.is_object() && r.contains("name")) dirs.push_back((p / r["name"].get<std::string>()).string());
      continue;
    }
    std::vector<std::string> sub;
    for (auto& e : fs::directory_iterator(p))
      if (e.is_directory() && is_run_dir(e.path())) sub.push_back(e.path().string());
    if (sub.empty()) fail("{}: not a run folder (no config.json / metrics.jsonl) and holds no run folders", a);
    std::sort(sub.begin(), sub.end());
    dirs.insert(dirs.end(), sub.begin(), sub.end());
  }
  std::vector<RunRef> out;
  std::set<std::string> seen;
  for (auto& d : dirs) {
    const std::string key = fs::absolute(d).lexically_normal().string();
    if (!seen.insert(key).second) continue;
    RunRef r;
    r.dir = d;
    json e = sweep_entry(d);
    if (!e.empty()) {
      r.sweep_arch = e.value("arch", std::string());
      r.sweep_status = e.value("status", std::string());
    }
    out.push_back(r);
  }
  return out;
}

struct Group {
  std::string name;
  std::vector<scaling::RunData> runs;
};

// 2.3e+12-style for constants that span many decades, fixed for the rest.
std::string fmt_num(double v) {
  if (!std::isfinite(v)) return "nan";
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e4 || a < 1e-2)) return fmt::format("{:.3e}", v);
  return fmt::format("{:.4g}", v);
}

std::string fmt_constants(const std::vector<std::pair<std::string, double>>& vals, const scaling::BootstrapSummary* b) {
  std::string s;
  for (size_t k = 0; k < vals.size(); ++k) {
    s += fmt::format("  {} {}", vals[k].first, fmt_num(vals[k].second));
    if (b && k < b->constants.size() && b->resamples - b->failed > 0) {
      const auto& c = b->constants[k];
      s += fmt::format(" [{}, {}]", fmt_num(c.p05), fmt_num(c.p95));
    }
  }
  return s;
}

int run_fit(const FitOpts& o) {
  apply_threads(o.threads);
  if (o.group_by != "pattern" && o.group_by != "preset" && o.group_by != "run")
    fail("--group-by must be pattern, preset or run, got '{}'", o.group_by);
  if (o.points != "frontier" && o.points != "final" && o.points != "all")
    fail("--points must be frontier, final or all, got '{}'", o.points);
  if (o.params != "matmul" && o.params != "total") fail("--params must be matmul or total, got '{}'", o.params);
  if (o.grid != "full" && o.grid != "small") fail("--grid must be full or small, got '{}'", o.grid);
  if (o.bootstrap < 0) fail("--bootstrap must be >= 0, got {}", o.bootstrap);
  if (!o.plot.empty() && fs::path(o.plot).extension() != ".svg") fail("--plot {}: the plot is an .svg file", o.plot);

  Timer timer;
  scaling::FitOptions fo;
  fo.grid = o.grid == "small" ? scaling::Grid::kSmall : scaling::Grid::kFull;

  // Read runs, group them.
  std::vector<Group> groups;
  json skipped_runs = json::array();
  for (const RunRef& ref : expand_runs(o.runs)) {
    if (!ref.sweep_status.empty() && ref.sweep_status != "done") {
      if (!o.json)
        fmt::print(stderr, "note: {}: skipped (sweep.json says '{}', not 'done')\n", ref.dir, ref.sweep_status);
      skipped_runs.push_back({{"dir", ref.dir}, {"reason", "sweep status " + ref.sweep_status}});
      continue;
    }
    scaling::RunData rd = scaling::read_run(ref.dir, o.metric);
    std::string g = o.group_by == "pattern" ? rd.arch
                    : o.group_by == "run"   ? rd.name
                    : !ref.sweep_arch.empty() ? ref.sweep_arch
                    : !rd.preset.empty()      ? rd.preset
                                              : rd.arch;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.name == g; });
    if (it == groups.end()) {
      groups.push_back({g, {}});
      it = groups.end() - 1;
    }
    it->runs.push_back(std::move(rd));
  }
  if (groups.empty()) fail("scaling fit: no finished runs to fit");

  const bool is_log_longppl = o.metric == "log_longppl";
  json out_groups = json::array();
  LinePlot plot{o.metric + " vs training compute", "training FLOPs", o.metric, true, true, {}};
  std::vector<Series> fit_lines, point_sets;

  for (const Group& g : groups) {
    json gj = {{"name", g.name}, {"runs", json::array()}};
    for (auto& r : g.runs) gj["runs"].push_back(r.dir);

    // ---- L(C): points with their run index.
    std::vector<double> C, Y;
    std::vector<int> unit;
    for (size_t ri = 0; ri < g.runs.size(); ++ri) {
      const auto& pts = g.runs[ri].points;
      for (size_t k = 0; k < pts.size(); ++k) {
        if (o.points == "final" && k + 1 != pts.size()) continue;
        if (!(pts[k].flops > 0)) continue;  // the step-0 evaluation has no compute
        C.push_back(pts[k].flops);
        Y.push_back(pts[k].value);
        unit.push_back(static_cast<int>(ri));
      }
    }
    auto select = [&](const std::vector<size_t>& idx, std::vector<double>& c, std::vector<double>& y) {
      c.clear();
      y.clear();
      if (o.points == "frontier") {
        std::vector<double> c0, y0;
        for (size_t i : idx) c0.push_back(C[i]), y0.push_back(Y[i]);
        for (size_t j : scaling::lower_frontier(c0, y0)) c.push_back(c0[j]), y.push_back(y0[j]);
      } else {
        for (size_t i : idx) c.push_back(C[i]), y.push_back(Y[i]);
      }
    };
    std::vector<size_t> all_idx(C.size());
    for (size_t i = 0; i < C.size(); ++i) all_idx[i] = i;
    std::vector<double> fc, fy;
    select(all_idx, fc, fy);
    std::set<double> distinct_c(fc.begin(), fc.end());
    gj["points_mode"] = o.points;
    gj["n_points"] = fc.size();
    std::string text = fmt::format("{}: {} run{}, {} {} point{} for L(C)\n", g.name, g.runs.size(),
                                   g.runs.size() == 1 ? "" : "s", fc.size(), o.points, fc.size() == 1 ? "" : "s");
    point_sets.push_back({g.name + " (data)", fc, fy, true, static_cast<int>(&g - groups.data())});
    if (distinct_c.size() < 3) {
      gj["power_law"] = nullptr;
      gj["power_law_skipped"] = fmt::format("{} distinct compute values, need 3", distinct_c.size());
      text += fmt::format("  L(C): skipped ({})\n", gj["power_law_skipped"].get<std::string>());
    } else {
      auto fit = [&](const std::vector<double>& c, const std::vector<double>& y, const scaling::FitOptions& opt) {
        return is_log_longppl ? scaling::fit_log_longppl(c, y, opt) : scaling::fit_power_law(c, y, opt);
      };
      scaling::PowerLawFit pl = fit(fc, fy, fo);
      json pj = {{"law", "L(C) = E + A * C^-alpha"}, {"E", pl.E}, {"A", pl.A}, {"alpha", pl.alpha},
                 {"objective", pl.objective}, {"n_points", pl.n_points}, {"starts", pl.n_starts}};
      std::unique_ptr<scaling::BootstrapSummary> bs;
      if (o.bootstrap > 0) {
        // Resample runs when there are enough of them; a group of one or two runs resamples its points.
        const bool by_run = g.runs.size() >= 3;
        std::vector<int> u = unit;
        if (!by_run)
          for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<int>(i);
        const int n_units = by_run ? static_cast<int>(g.runs.size()) : static_cast<int>(u.size());
        scaling::FitOptions bo = fo;
        bo.grid = scaling::Grid::kSmall;
        bo.extra_starts.push_back(pl.theta);
        bs = std::make_unique<scaling::BootstrapSummary>(scaling::bootstrap(
            n_units, o.bootstrap, o.seed, {"E", "A", "alpha"}, {pl.E, pl.A, pl.alpha},
            [&](const std::vector<int>& draw) -> std::vector<double> {
              std::vector<double> c, y;
              select(scaling::points_of_draw(u, draw), c, y);
              if (std::set<double>(c.begin(), c.end()).size() < 3) return {};
              scaling::PowerLawFit f = fit(c, y, bo);
              return {f.E, f.A, f.alpha};
            }));
        pj["bootstrap"] = bs->to_json();
        pj["bootstrap"]["unit"] = by_run ? "run" : "point";
      }
      gj["power_law"] = pj;
      text += fmt::format("  L(C) = E + A*C^-alpha:{}  (objective {:.3g})\n",
                          fmt_constants({{"E", pl.E}, {"A", pl.A}, {"alpha", pl.alpha}}, bs.get()), pl.objective);
      // Fitted curve over the data's range, half a decade beyond each end.
      const double lo = *distinct_c.begin() / 3, hi = *distinct_c.rbegin() * 3;
      Series line{fmt::format("{} fit (alpha {:.3f})", g.name, pl.alpha), {}, {}, false};
      for (int i = 0; i <= 60; ++i) {
        const double c = lo * std::pow(hi / lo, i / 60.0);
        line.x.push_back(c);
        line.y.push_back(pl.predict(c));
      }
      line.color = static_cast<int>(&g - groups.data());
      fit_lines.push_back(line);
    }

    // ---- Chinchilla L(N, D) over the runs' final points.
    std::vector<double> N, D, L;
    std::vector<int> cu;
    std::set<std::pair<double, double>> distinct_nd;
    for (size_t ri = 0; ri < g.runs.size(); ++ri) {
      const auto& p = g.runs[ri].points.back();
      if (!(p.tokens > 0)) continue;
      N.push_back(o.params == "matmul" ? p.matmul_params : p.params);
      D.push_back(p.tokens);
      L.push_back(p.value);
      cu.push_back(static_cast<int>(ri));
      distinct_nd.insert({N.back(), D.back()});
    }
    if (distinct_nd.size() < 5) {
      gj["chinchilla"] = nullptr;
      gj["chinchilla_skipped"] = fmt::format("{} distinct (N, D) final points, need 5", distinct_nd.size());
      text += fmt::format("  L(N, D): skipped ({})\n", gj["chinchilla_skipped"].get<std::string>());
    } else {
      scaling::ChinchillaFit cf = scaling::fit_chinchilla(N, D, L, fo);
      const double ea = cf.beta / (cf.alpha + cf.beta), eb = cf.alpha / (cf.alpha + cf.beta);
      json cj = {{"law", "L(N, D) = E + A / N^alpha + B / D^beta"}, {"N", o.params == "matmul" ? "matmul_params" : "params"},
                 {"E", cf.E}, {"A", cf.A}, {"B", cf.B}, {"alpha", cf.alpha}, {"beta", cf.beta},
                 {"objective", cf.objective}, {"n_points", cf.n_points}, {"starts", cf.n_starts},
                 {"n_opt_exponent", ea}, {"d_opt_exponent", eb}};
      std::unique_ptr<scaling::BootstrapSummary> bs;
      if (o.bootstrap > 0) {
        bs = std::make_unique<scaling::BootstrapSummary>(
            scaling::bootstrap_chinchilla(cu, N, D, L, cf, o.bootstrap, o.seed, fo));
        cj["bootstrap"] = bs->to_json();
        cj["bootstrap"]["unit"] = "run";
      }
      gj["chinchilla"] = cj;
      text += fmt::format("  L(N, D) = E + A/N^alpha + B/D^beta ({} runs):{}  (objective {:.3g})\n", N.size(),
                          fmt_constants({{"E", cf.E}, {"A", cf.A}, {"B", cf.B}, {"alpha", cf.alpha}, {"beta", cf.beta}},
                                        bs.get()),
                          cf.objective);
      text += fmt::format("  compute-optimal (C = 6ND): N_opt ~ C^{:.3f}, D_opt ~ C^{:.3f}\n", ea, eb);
    }
    if (!o.json) fmt::print("{}", text);
    out_groups.push_back(gj);
  }

  if (!o.plot.empty()) {
    for (auto& s : point_sets) plot.series.push_back(s);
    for (auto& s : fit_lines) plot.series.push_back(s);
    write_line_plot(plot, o.plot);
  }
  if (o.json) {
    print_json({{"metric", o.metric}, {"group_by", o.group_by}, {"points", o.points}, {"grid", o.grid},
                {"bootstrap", o.bootstrap}, {"seed", o.seed}, {"groups", out_groups}, {"skipped_runs", skipped_runs},
                {"plot", o.plot.empty() ? json(nullptr) : json(o.plot)}, {"seconds", timer.seconds()}});
  } else {
    if (o.bootstrap > 0)
      fmt::print("[lo, hi]: 5-95% bootstrap interval over {} resamples (seed {})\n", o.bootstrap, o.seed);
    if (!o.plot.empty()) fmt::print("plot: {}\n", o.plot);
  }
  return 0;
}

}  // namespace

Command register_scaling(CLI::App& app) {
  auto* sub = app.add_subcommand("scaling", "scaling-law fits over many runs (loss or log LongPPL vs compute, params, tokens)");
  sub->require_subcommand(1);
  auto o = std::make_shared<FitOpts>();
  auto* f = sub->add_subcommand("fit", "fit L(C) per architecture and Chinchilla L(N, D); bootstrap intervals; plot");
  f->add_option("runs", o->runs, "run folders (or a sweep folder / its sweep.json, or a folder of runs)")
      ->required()
      ->expected(-1);
  f->add_option("--metric", o->metric, "evaluation field to fit: val_loss | log_longppl (or any numeric eval field)")
      ->capture_default_str();
  f->add_option("--group-by", o->group_by, "pattern (architecture key) | preset (sweep arch / preset name) | run")
      ->capture_default_str();
  f->add_option("--points", o->points,
                "L(C) points: frontier (lower envelope of all evaluations) | final (each run's last) | all")
      ->capture_default_str();
  f->add_option("--params", o->params, "N for L(N, D): matmul (non-embedding) | total")->capture_default_str();
  f->add_option("--bootstrap", o->bootstrap, "bootstrap resamples (0 = off)")->capture_default_str()
      ->check(in_range(0, 1e6));
  f->add_option("--seed", o->seed, "bootstrap seed")->capture_default_str()
      ->check(seed_range());
  f->add_option("--grid", o->grid, "L-BFGS start grid: full (reference, 4500 starts for L(N, D)) | small")
      ->capture_default_str();
  f->add_option("--plot", o->plot, "write points and fitted curves (log-log) to this .svg");
  f->add_flag("--json", o->json, "print one JSON object instead of text");
  add_threads_flag(f, &o->threads);
  return {sub, [o, f]() -> int {
            if (f->parsed()) return run_fit(*o);
            return 0;
          }};
}

}  // namespace hlm::cli
