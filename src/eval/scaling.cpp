#include "eval/scaling.h"

#include <lbfgs.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "model/config.h"
#include "train/run_folder.h"

namespace hlm::scaling {

namespace fs = std::filesystem;
using nlohmann::json;

double huber(double r, double delta) {
  const double a = std::fabs(r);
  return a <= delta ? 0.5 * r * r : delta * (a - 0.5 * delta);
}

double huber_grad(double r, double delta) {
  if (r > delta) return delta;
  if (r < -delta) return -delta;
  return r;
}

namespace {

// Stable log(sum exp(u_k)) and the softmax weights w_k = exp(u_k - lse).
template <int K>
double lse(const double (&u)[K], double (&w)[K]) {
  double m = u[0];
  for (int k = 1; k < K; ++k) m = std::max(m, u[k]);
  double s = 0;
  for (int k = 0; k < K; ++k) s += (w[k] = std::exp(u[k] - m));
  for (int k = 0; k < K; ++k) w[k] /= s;
  return m + std::log(s);
}

void check_points(const char* what, std::initializer_list<const std::vector<double>*> xs, size_t min_points) {
  const size_t n = (*xs.begin())->size();
  for (auto* x : xs)
    if (x->size() != n) fail("scaling fit {}: inputs have different lengths ({} vs {})", what, n, x->size());
  if (n < min_points) fail("scaling fit {}: {} points, need at least {}", what, n, min_points);
  for (auto* x : xs)
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite((*x)[i]) || (*x)[i] <= 0)
        fail("scaling fit {}: value {} at point {} is not a finite positive number", what, (*x)[i], i);
}

using Objective = std::function<double(const double* theta, double* grad)>;

struct LbfgsInstance {
  const Objective* f;
};

lbfgsfloatval_t lbfgs_evaluate(void* inst, const lbfgsfloatval_t* x, lbfgsfloatval_t* g, const int n,
                               const lbfgsfloatval_t) {
  const auto* self = static_cast<LbfgsInstance*>(inst);
  double v = (*self->f)(x, g);
  if (!std::isfinite(v)) {  // keep the line search away from overflow: a huge but finite value
    for (int i = 0; i < n; ++i) g[i] = 0;
    return 1e300;
  }
  return v;
}

struct MultiStartResult {
  std::vector<double> theta;
  double objective = std::numeric_limits<double>::infinity();
};

// L-BFGS from every start; the lowest objective wins (ties: the earliest start), so the result does not
// depend on the thread count.
MultiStartResult minimize_multistart(int dim, const std::vector<std::vector<double>>& starts, const Objective& f,
                                     int max_iterations, size_t n_points) {
  const long n = static_cast<long>(starts.size());
  // Small problems (a bootstrap refit) finish in well under a millisecond per start: waking threads costs
  // more than it saves, so only large grids (the full Chinchilla grid) are split over threads.
  const bool parallel = static_cast<double>(n) * static_cast<double>(n_points) >= 5e4 && !omp_in_parallel();
  const int nt = parallel ? std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(n))) : 1;
  std::vector<MultiStartResult> best(static_cast<size_t>(nt));
  std::vector<long> best_idx(static_cast<size_t>(nt), -1);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int t = omp_get_thread_num();
    const long b = n * t / nt, e = n * (t + 1) / nt;
    lbfgs_parameter_t p;
    lbfgs_parameter_init(&p);
    p.max_iterations = max_iterations;
    p.epsilon = 1e-10;  // stop on the objective's progress (past/delta) rather than the gradient norm
    p.past = 10;
    p.delta = 1e-12;
    p.linesearch = LBFGS_LINESEARCH_MORETHUENTE;
    p.max_linesearch = 40;
    LbfgsInstance inst{&f};
    std::vector<double> x(static_cast<size_t>(dim));
    for (long s = b; s < e; ++s) {
      std::copy(starts[static_cast<size_t>(s)].begin(), starts[static_cast<size_t>(s)].end(), x.begin());
      lbfgsfloatval_t fx = std::numeric_limits<double>::infinity();
      // Any termination status is acceptable (line-search failures near a Huber kink are common); what
      // counts is the objective at the returned point, recomputed below.
      lbfgs(dim, x.data(), &fx, lbfgs_evaluate, nullptr, &inst, &p);
      bool finite = true;
      for (double v : x) finite = finite && std::isfinite(v);
      if (!finite) continue;
      const double v = f(x.data(), nullptr);
      auto& bt = best[static_cast<size_t>(t)];
      if (std::isfinite(v) && v < bt.objective) {
        bt.objective = v;
        bt.theta = x;
        best_idx[static_cast<size_t>(t)] = s;
      }
    }
  }
  MultiStartResult r;
  long ri = -1;
  for (int t = 0; t < nt; ++t) {
    const auto& bt = best[static_cast<size_t>(t)];
    if (best_idx[static_cast<size_t>(t)] < 0) continue;
    if (bt.objective < r.objective || (bt.objective == r.objective && best_idx[static_cast<size_t>(t)] < ri)) {
      r = bt;
      ri = best_idx[static_cast<size_t>(t)];
    }
  }
  if (ri < 0) fail("scaling fit: L-BFGS found no finite optimum from {} starts", n);
  return r;
}

std::vector<double> grid_values(double lo, double hi, double step) {
  std::vector<double> v;
  for (double x = lo; x <= hi + 1e-9; x += step) v.push_back(x);
  return v;
}

struct GridAxes {
  std::vector<double> exponent, e, coef;
};
GridAxes grid_axes(Grid g) {
  if (g == Grid::kSmall) return {grid_values(0, 2, 1), grid_values(-1, 1, 1), grid_values(0, 20, 10)};
  return {grid_values(0, 2, 0.5), grid_values(-1, 1, 0.5), grid_values(0, 25, 5)};
}

void check_extra_starts(const FitOptions& o, size_t dim, const char* what) {
  for (auto& s : o.extra_starts)
    if (s.size() != dim) fail("scaling fit {}: an extra start has {} values, need {}", what, s.size(), dim);
}

}  // namespace

// ---- power law ----------------------------------------------------------------------------------

double power_law_objective(const double* th, const std::vector<double>& C, const std::vector<double>& L, double delta,
                           double* grad) {
  const double a = th[0], alpha = th[1], e = th[2];
  double obj = 0, ga = 0, galpha = 0, ge = 0;
  for (size_t i = 0; i < C.size(); ++i) {
    const double lc = std::log(C[i]);
    double u[2] = {a - alpha * lc, e}, w[2];
    const double r = lse(u, w) - std::log(L[i]);
    obj += huber(r, delta);
    if (grad) {
      const double h = huber_grad(r, delta);
      ga += h * w[0];
      galpha -= h * w[0] * lc;
      ge += h * w[1];
    }
  }
  if (grad) grad[0] = ga, grad[1] = galpha, grad[2] = ge;
  return obj;
}

double PowerLawFit::predict(double C) const { return E + A * std::pow(C, -alpha); }

PowerLawFit fit_power_law(const std::vector<double>& C, const std::vector<double>& L, const FitOptions& o) {
  check_points("L(C)", {&C, &L}, 3);
  if (!(o.huber_delta > 0)) fail("scaling fit L(C): huber_delta must be > 0, got {}", o.huber_delta);
  check_extra_starts(o, 3, "L(C)");
  const GridAxes g = grid_axes(o.grid);
  std::vector<std::vector<double>> starts;
  for (double alpha : g.exponent)
    for (double e : g.e)
      for (double a : g.coef) starts.push_back({a, alpha, e});
  for (auto& s : o.extra_starts) starts.push_back(s);
  const Objective f = [&](const double* th, double* grad) { return power_law_objective(th, C, L, o.huber_delta, grad); };
  MultiStartResult m = minimize_multistart(3, starts, f, o.max_iterations, C.size());
  PowerLawFit r;
  r.theta = m.theta;
  r.A = std::exp(m.theta[0]);
  r.alpha = m.theta[1];
  r.E = std::exp(m.theta[2]);
  r.objective = m.objective;
  r.n_points = static_cast<int>(C.size());
  r.n_starts = static_cast<int>(starts.size());
  return r;
}

PowerLawFit fit_log_longppl(const std::vector<double>& C, const std::vector<double>& log_longppl, const FitOptions& o) {
  for (size_t i = 0; i < log_longppl.size(); ++i)
    if (!(log_longppl[i] > 0))
      fail("scaling fit log(LongPPL): value {} at point {} is not > 0 (LongPPL must exceed 1)", log_longppl[i], i);
  return fit_power_law(C, log_longppl, o);
}

// ---- Chinchilla ---------------------------------------------------------------------------------

double chinchilla_objective(const double* th, const std::vector<double>& N, const std::vector<double>& D,
                            const std::vector<double>& L, double delta, double* grad) {
  const double a = th[0], b = th[1], e = th[2], alpha = th[3], beta = th[4];
  double obj = 0, g[5] = {0, 0, 0, 0, 0};
  for (size_t i = 0; i < N.size(); ++i) {
    const double ln = std::log(N[i]), ld = std::log(D[i]);
    double u[3] = {a - alpha * ln, b - beta * ld, e}, w[3];
    const double r = lse(u, w) - std::log(L[i]);
    obj += huber(r, delta);
    if (grad) {
      const double h = huber_grad(r, delta);
      g[0] += h * w[0];
      g[1] += h * w[1];
      g[2] += h * w[2];
      g[3] -= h * w[0] * ln;
      g[4] -= h * w[1] * ld;
    }
  }
  if (grad) std::copy(g, g + 5, grad);
  return obj;
}

double ChinchillaFit::predict(double N, double D) const { return E + A * std::pow(N, -alpha) + B * std::pow(D, -beta); }

double ChinchillaFit::n_opt(double C) const {
  const double G = std::pow(alpha * A / (beta * B), 1.0 / (alpha + beta));
  return G * std::pow(C / 6.0, beta / (alpha + beta));
}

ChinchillaFit fit_chinchilla(const std::vector<double>& N, const std::vector<double>& D, const std::vector<double>& L,
                             const FitOptions& o) {
  check_points("L(N, D)", {&N, &D, &L}, 5);
  if (!(o.huber_delta > 0)) fail("scaling fit L(N, D): huber_delta must be > 0, got {}", o.huber_delta);
  check_extra_starts(o, 5, "L(N, D)");
  const GridAxes g = grid_axes(o.grid);
  std::vector<std::vector<double>> starts;
  for (double alpha : g.exponent)
    for (double beta : g.exponent)
      for (double e : g.e)
        for (double a : g.coef)
          for (double b : g.coef) starts.push_back({a, b, e, alpha, beta});
  for (auto& s : o.extra_starts) starts.push_back(s);
  const Objective f = [&](const double* th, double* grad) {
    return chinchilla_objective(th, N, D, L, o.huber_delta, grad);
  };
  MultiStartResult m = minimize_multistart(5, starts, f, o.max_iterations, N.size());
  ChinchillaFit r;
  r.theta = m.theta;
  r.A = std::exp(m.theta[0]);
  r.B = std::exp(m.theta[1]);
  r.E = std::exp(m.theta[2]);
  r.alpha = m.theta[3];
  r.beta = m.theta[4];
  r.objective = m.objective;
  r.n_points = static_cast<int>(N.size());
  r.n_starts = static_cast<int>(starts.size());
  return r;
}

// ---- bootstrap ----------------------------------------------------------------------------------

json BootstrapSummary::to_json() const {
  json c = json::object();
  for (auto& k : constants)
    c[k.name] = {{"value", k.value}, {"mean", k.mean}, {"std", k.std}, {"p05", k.p05}, {"p95", k.p95}};
  return {{"resamples", resamples}, {"failed", failed}, {"seed", seed}, {"constants", c}};
}

namespace {
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}
}  // namespace

BootstrapSummary bootstrap(int n_units, int resamples, std::uint64_t seed, const std::vector<std::string>& names,
                           const std::vector<double>& full_values,
                           const std::function<std::vector<double>(const std::vector<int>& draw)>& refit) {
  if (n_units < 1) fail("scaling bootstrap: no units (runs) to resample");
  if (resamples < 0) fail("scaling bootstrap: resamples must be >= 0, got {}", resamples);
  if (full_values.size() != names.size())
    fail("scaling bootstrap: {} names but {} values", names.size(), full_values.size());
  BootstrapSummary s;
  s.resamples = resamples;
  s.seed = seed;
  Rng rng(seed);
  std::vector<std::vector<double>> vals(names.size());
  std::vector<int> draw(static_cast<size_t>(n_units));
  for (int r = 0; r < resamples; ++r) {
    for (auto& d : draw) d = static_cast<int>(rng.below(static_cast<std::uint64_t>(n_units)));
    std::vector<double> v;
    try {
      v = refit(draw);
    } catch (const Error&) {
      v.clear();
    }
    bool ok = v.size() == names.size();
    for (double x : v) ok = ok && std::isfinite(x);
    if (!ok) {
      ++s.failed;
      continue;
    }
    for (size_t k = 0; k < v.size(); ++k) vals[k].push_back(v[k]);
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t k = 0; k < names.size(); ++k) {
    ConstantSummary c;
    c.name = names[k];
    c.value = full_values[k];
    auto& x = vals[k];
    const double n = static_cast<double>(x.size());
    c.mean = c.std = nan;
    if (!x.empty()) {
      double sum = 0;
      for (double v : x) sum += v;
      c.mean = sum / n;
      double ss = 0;
      for (double v : x) ss += (v - c.mean) * (v - c.mean);
      c.std = x.size() > 1 ? std::sqrt(ss / (n - 1)) : 0.0;
    }
    std::sort(x.begin(), x.end());
    c.p05 = percentile(x, 0.05);
    c.p95 = percentile(x, 0.95);
    s.constants.push_back(c);
  }
  return s;
}

std::vector<size_t> points_of_draw(const std::vector<int>& unit_of_point, const std::vector<int>& draw) {
  std::map<int, std::vector<size_t>> by_unit;
  for (size_t i = 0; i < unit_of_point.size(); ++i) by_unit[unit_of_point[i]].push_back(i);
  std::vector<size_t> out;
  for (int u : draw) {
    auto it = by_unit.find(u);
    if (it != by_unit.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

namespace {
int count_units(const std::vector<int>& unit_of_point) {
  int m = -1;
  for (int u : unit_of_point) {
    if (u < 0) fail("scaling bootstrap: negative unit index {}", u);
    m = std::max(m, u);
  }
  return m + 1;
}
FitOptions bootstrap_options(const FitOptions& o, const std::vector<double>& full_theta) {
  FitOptions b = o;
  b.grid = Grid::kSmall;
  b.extra_starts.push_back(full_theta);
  return b;
}
}  // namespace

BootstrapSummary bootstrap_power_law(const std::vector<int>& unit_of_point, const std::vector<double>& C,
                                     const std::vector<double>& L, const PowerLawFit& full, int resamples,
                                     std::uint64_t seed, const FitOptions& o) {
  if (unit_of_point.size() != C.size() || C.size() != L.size())
    fail("scaling bootstrap L(C): {} unit labels for {} / {} points", unit_of_point.size(), C.size(), L.size());
  const FitOptions bo = bootstrap_options(o, full.theta);
  return bootstrap(count_units(unit_of_point), resamples, seed, {"E", "A", "alpha"}, {full.E, full.A, full.alpha},
                   [&](const std::vector<int>& draw) -> std::vector<double> {
                     std::vector<double> c, l;
                     std::set<double> distinct;
                     for (size_t i : points_of_draw(unit_of_point, draw)) {
                       c.push_back(C[i]);
                       l.push_back(L[i]);
                       distinct.insert(C[i]);
                     }
                     if (distinct.size() < 3) return {};
                     PowerLawFit f = fit_power_law(c, l, bo);
                     return {f.E, f.A, f.alpha};
                   });
}

BootstrapSummary bootstrap_chinchilla(const std::vector<int>& unit_of_point, const std::vector<double>& N,
                                      const std::vector<double>& D, const std::vector<double>& L,
                                      const ChinchillaFit& full, int resamples, std::uint64_t seed,
                                      const FitOptions& o) {
  if (unit_of_point.size() != N.size() || N.size() != D.size() || D.size() != L.size())
    fail("scaling bootstrap L(N, D): {} unit labels for {} / {} / {} points", unit_of_point.size(), N.size(), D.size(),
         L.size());
  const FitOptions bo = bootstrap_options(o, full.theta);
  return bootstrap(count_units(unit_of_point), resamples, seed, {"E", "A", "B", "alpha", "beta"},
                   {full.E, full.A, full.B, full.alpha, full.beta},
                   [&](const std::vector<int>& draw) -> std::vector<double> {
                     std::vector<double> n, d, l;
                     std::set<std::pair<double, double>> distinct;
                     for (size_t i : points_of_draw(unit_of_point, draw)) {
                       n.push_back(N[i]);
                       d.push_back(D[i]);
                       l.push_back(L[i]);
                       distinct.insert({N[i], D[i]});
                     }
                     if (distinct.size() < 5) return {};
                     ChinchillaFit f = fit_chinchilla(n, d, l, bo);
                     return {f.E, f.A, f.B, f.alpha, f.beta};
                   });
}

std::vector<size_t> lower_frontier(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) fail("lower_frontier: x has {} values, y has {}", x.size(), y.size());
  std::vector<size_t> idx;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i]) && x[i] > 0) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] != x[b] ? x[a] < x[b] : y[a] < y[b]; });
  std::vector<size_t> out;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i : idx)
    if (y[i] < best) {
      best = y[i];
      out.push_back(i);
    }
  return out;
}

// ---- run folders --------------------------------------------------------------------------------

namespace {
json read_json_file(const fs::path& p, const char* hint) {
  if (!fs::exists(p)) fail("{}: missing{}", p.string(), hint);
  const std::string text = read_text_file(p.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", p.string(), e.what());
  }
}

ModelConfig parse_config(const json& j, const std::string& src) {
  const json& m = j.contains("model") && j["model"].is_object() ? j["model"] : j;
  return ModelConfig::from_json(m, src);
}

std::string key_of(const ModelConfig& c) {
  std::string k = c.pattern;
  const bool has_s = c.pattern.find('S') != std::string::npos, has_f = c.pattern.find('F') != std::string::npos;
  if (has_s) {
    k += fmt::format(" w{}", c.type('S').window);
    if (!c.type('S').rope) k += " S-nope";
  }
  if (has_f) k += c.type('F').rope ? " F-rope" : " F-nope";
  return k;
}

bool same_arch(const ModelConfig& a, const ModelConfig& b) {
  if (a.pattern != b.pattern) return false;
  for (char ch : a.pattern) {
    if (a.type(ch).rope != b.type(ch).rope) return false;
    if (ch == 'S' && a.type(ch).window != b.type(ch).window) return false;
  }
  return true;
}
}  // namespace

std::string arch_key(const json& model_config) { return key_of(parse_config(model_config, "config")); }

std::string matching_preset(const json& model_config) {
  const ModelConfig c = parse_config(model_config, "config");
  for (const auto& name : preset_names())
    if (same_arch(c, ModelConfig::from_json(preset_json(name), "preset '" + name + "'"))) return name;
  return "";
}

RunData read_run(const std::string& dir, const std::string& metric) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail("{}: no such run folder", dir);
  RunData r;
  r.dir = dir;
  r.name = fs::path(dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  const fs::path cfg_path = run_folder::config(d);
  r.config = read_json_file(cfg_path, " (not a run folder written by `hybridlm train --out`?)");
  if (!r.config.is_object()) fail("{}: must be a JSON object (the model config)", cfg_path.string());
  const ModelConfig cfg = parse_config(r.config, cfg_path.string());
  r.arch = key_of(cfg);
  for (const auto& name : preset_names())
    if (same_arch(cfg, ModelConfig::from_json(preset_json(name), "preset '" + name + "'"))) {
      r.preset = name;
      break;
    }

  const fs::path mp = run_folder::metrics(d);
  if (!fs::exists(mp)) fail("{}: missing (the run has not logged any evaluation yet)", mp.string());
  std::istringstream f(read_text_file(mp.string(), "metrics file", std::size_t{4} << 30));
  std::map<long, EvalPoint> by_step;
  std::string line;
  long lineno = 0;
  bool any_eval = false;
  const std::string path = mp.string();
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json row;
    try {
      row = json::parse(line);
    } catch (const json::exception& e) {  // also out_of_range: a number too large
      fail("{}:{}: malformed JSON: {}", path, lineno, e.what());
    }
    if (!row.is_object()) fail("{}:{}: a metrics row must be a JSON object", path, lineno);
    if (!row.contains("val_loss")) continue;  // a training row
    any_eval = true;
    auto num = [&](const char* field) {
      if (!row.contains(field) || !row[field].is_number())
        fail("{}:{}: evaluation row has no numeric '{}'", path, lineno, field);
      return row[field].get<double>();
    };
    EvalPoint p;
    if (!row.contains("step") || !row["step"].is_number_integer())
      fail("{}:{}: evaluation row has no integer 'step'", path, lineno);
    p.step = row["step"].get<long>();
    p.tokens = num("tokens");
    p.flops = num("flops");
    p.params = num("params");
    p.matmul_params = num("matmul_params");
    double v = std::numeric_limits<double>::quiet_NaN();
    if (row.contains(metric) && !row[metric].is_null()) {
      if (!row[metric].is_number()) fail("{}:{}: field '{}' is not a number", path, lineno, metric);
      v = row[metric].get<double>();
    } else if (metric == "log_longppl" && row.contains("longppl") && !row["longppl"].is_null()) {
      if (!row["longppl"].is_number()) fail("{}:{}: field 'longppl' is not a number", path, lineno);
      v = std::log(row["longppl"].get<double>());
    }
    if (!std::isfinite(v)) continue;
    p.value = v;
    by_step[p.step] = p;  // the last row of a step wins (re-evaluated after a resume)
  }
  if (!any_eval) fail("{}: no evaluation rows (rows with 'val_loss')", path);
  if (by_step.empty())
    fail("{}: no evaluation row has a numeric '{}'{}", path, metric,
         metric == "log_longppl" || metric == "longppl" ? " (rows get it when training runs LongPPL evaluation)" : "");
  for (auto& [s, p] : by_step) r.points.push_back(p);
  return r;
}

}  // namespace hlm::scaling
