#include "study/scaling_fit.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "eval/scaling.h"
#include "study/json_file.h"
#include "train/run_folder.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_sweep(const fs::path& p) {
  json j = read_json_file(p.string());
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

bool is_run_dir(const fs::path& p) { return fs::exists(run_folder::metrics(p)) || fs::exists(run_folder::config(p)); }

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

}  // namespace

void check_fit_policy(const FitPolicy& o) {
  if (o.group_by != "pattern" && o.group_by != "preset" && o.group_by != "run")
    fail("--group-by must be pattern, preset or run, got '{}'", o.group_by);
  if (o.points != "frontier" && o.points != "final" && o.points != "all")
    fail("--points must be frontier, final or all, got '{}'", o.points);
  if (o.params != "matmul" && o.params != "total") fail("--params must be matmul or total, got '{}'", o.params);
  if (o.grid != "full" && o.grid != "small") fail("--grid must be full or small, got '{}'", o.grid);
  if (o.bootstrap < 0) fail("--bootstrap must be >= 0, got {}", o.bootstrap);
}

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

FitResult fit_runs(const std::vector<RunRef>& runs, const FitPolicy& o, bool quiet) {
  check_fit_policy(o);
  FitResult res;
  scaling::FitOptions fo;
  fo.grid = o.grid == "small" ? scaling::Grid::kSmall : scaling::Grid::kFull;

  // Read runs, group them.
  std::vector<Group> groups;
  for (const RunRef& ref : runs) {
    if (!ref.sweep_status.empty() && ref.sweep_status != "done") {
      if (!quiet)
        fmt::print(stderr, "note: {}: skipped (sweep.json says '{}', not 'done')\n", ref.dir, ref.sweep_status);
      res.skipped_runs.push_back({{"dir", ref.dir}, {"reason", "sweep status " + ref.sweep_status}});
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
    res.points.push_back({g.name + " (data)", fc, fy, true, static_cast<int>(&g - groups.data())});
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
      res.fits.push_back(line);
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
    res.text += text;
    res.groups.push_back(gj);
  }

  return res;
}

}  // namespace hlm::study
