#pragma once
// Scaling-law fits (docs/scaling.md; formulas and constants: docs/algorithms.md §9).
//   power law   L(C)    = E + A * C^-alpha            fitted as log L = LSE(a - alpha ln C, e)
//   Chinchilla  L(N, D) = E + A / N^alpha + B / D^beta fitted as log L = LSE(a - alpha ln N, b - beta ln D, e)
// with A = e^a, B = e^b, E = e^e; the objective is sum_i Huber_delta(log Lhat_i - log L_i) (delta 1e-3),
// minimised by L-BFGS (Debian liblbfgs) from every point of a grid of starts; the lowest objective wins.
// Also: a bootstrap over runs, the lower envelope (frontier) of loss vs compute, and reading the
// evaluation rows of run folders written by `hybridlm train`.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hlm::scaling {

// Huber_delta(r) = r^2/2 if |r| <= delta else delta (|r| - delta/2); its derivative.
double huber(double r, double delta);
double huber_grad(double r, double delta);

enum class Grid {
  kFull,   // the reference grid: alpha, beta in {0, .5, 1, 1.5, 2}, e in {-1, -.5, 0, .5, 1}, a, b in {0, 5, .., 25}
  kSmall,  // every other value: alpha, beta in {0, 1, 2}, e in {-1, 0, 1}, a, b in {0, 10, 20}
};

struct FitOptions {
  Grid grid = Grid::kFull;
  double huber_delta = 1e-3;
  int max_iterations = 500;  // per start
  // Extra starts tried besides the grid, in the fit's own parameter order (power law: a, alpha, e;
  // Chinchilla: a, b, e, alpha, beta). The bootstrap passes the full-data optimum here.
  std::vector<std::vector<double>> extra_starts;
};

struct PowerLawFit {
  double E = 0, A = 0, alpha = 0;
  double objective = 0;  // sum of Huber(log residual) at the optimum
  int n_points = 0, n_starts = 0;
  std::vector<double> theta;  // (a, alpha, e), reusable as a start
  double predict(double C) const;
};

struct ChinchillaFit {
  double E = 0, A = 0, B = 0, alpha = 0, beta = 0;
  double objective = 0;
  int n_points = 0, n_starts = 0;
  std::vector<double> theta;  // (a, b, e, alpha, beta)
  double predict(double N, double D) const;
  // Compute-optimal allocation for C = 6 N D: N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = (C/6) / N_opt.
  double n_opt(double C) const;
  double d_opt(double C) const { return C / 6.0 / n_opt(C); }
};

// Objectives (value; gradient w.r.t. theta written into grad when non-null). Exposed for tests.
double power_law_objective(const double* theta, const std::vector<double>& C, const std::vector<double>& L,
                           double delta, double* grad);
double chinchilla_objective(const double* theta, const std::vector<double>& N, const std::vector<double>& D,
                            const std::vector<double>& L, double delta, double* grad);

// Fits; hlm::Error ("scaling fit: ...") when sizes differ, a value is not finite and > 0, or there are
// fewer points than the law has constants (3 / 5).
PowerLawFit fit_power_law(const std::vector<double>& C, const std::vector<double>& L, const FitOptions& o = {});
ChinchillaFit fit_chinchilla(const std::vector<double>& N, const std::vector<double>& D, const std::vector<double>& L,
                             const FitOptions& o = {});
// log(LongPPL) against compute: the same power law, on y = log LongPPL (> 0 because LongPPL > 1),
// i.e. log LongPPL(C) = E + A C^-alpha, E being the irreducible log-perplexity of the key tokens.
PowerLawFit fit_log_longppl(const std::vector<double>& C, const std::vector<double>& log_longppl,
                            const FitOptions& o = {});

// ---- bootstrap ----------------------------------------------------------------------------------
struct ConstantSummary {
  std::string name;
  double value = 0;             // the full-data fit
  double mean = 0, std = 0;     // over successful resamples (std: n-1 denominator)
  double p05 = 0, p95 = 0;      // 5th / 95th percentiles (linear interpolation between order statistics)
};
struct BootstrapSummary {
  int resamples = 0, failed = 0;
  std::uint64_t seed = 0;
  std::vector<ConstantSummary> constants;
  nlohmann::json to_json() const;
};

// Draws `resamples` multisets of n_units unit indices (with replacement; seeded, so the same seed gives
// the same draws) and calls refit(draw) for each; refit returns the constants in `names` order, or an
// empty vector when the resample cannot be fitted (counted in `failed`).
BootstrapSummary bootstrap(int n_units, int resamples, std::uint64_t seed, const std::vector<std::string>& names,
                           const std::vector<double>& full_values,
                           const std::function<std::vector<double>(const std::vector<int>& draw)>& refit);

// Point indices whose (unit) is drawn, repeated as often as it was drawn.
std::vector<size_t> points_of_draw(const std::vector<int>& unit_of_point, const std::vector<int>& draw);

// Bootstrap of the two laws over units (runs): unit_of_point[i] names the run of point i. Refits use
// the small grid plus the full fit's optimum as an extra start (docs/scaling.md).
BootstrapSummary bootstrap_power_law(const std::vector<int>& unit_of_point, const std::vector<double>& C,
                                     const std::vector<double>& L, const PowerLawFit& full, int resamples,
                                     std::uint64_t seed, const FitOptions& o = {});
BootstrapSummary bootstrap_chinchilla(const std::vector<int>& unit_of_point, const std::vector<double>& N,
                                      const std::vector<double>& D, const std::vector<double>& L,
                                      const ChinchillaFit& full, int resamples, std::uint64_t seed,
                                      const FitOptions& o = {});

// Indices of the lower envelope of (x, y): sorted by x (ties by y), each point kept when its y is below
// every y at smaller-or-equal x. Points with x <= 0 or a non-finite value are dropped.
std::vector<size_t> lower_frontier(const std::vector<double>& x, const std::vector<double>& y);

// ---- run folders --------------------------------------------------------------------------------
struct EvalPoint {
  long step = 0;
  double tokens = 0, flops = 0, params = 0, matmul_params = 0;
  double value = 0;  // the requested metric
};

struct RunData {
  std::string dir;           // as given
  std::string name;          // folder name
  std::string arch;          // architecture key, e.g. "SSSF w128 F-nope"
  std::string preset;        // matching preset name, or "" when the architecture is no preset
  nlohmann::json config;     // config.json
  std::vector<EvalPoint> points;  // evaluation rows that have the metric, by step (a step logged twice,
                                  // e.g. re-evaluated after a resume, keeps its last row)
};

// Reads RUN/config.json and the evaluation rows (rows with "val_loss") of RUN/metrics.jsonl. metric is
// a field of those rows; "log_longppl" falls back to log("longppl"). Rows whose metric is null/absent
// are skipped. hlm::Error naming the file (and line/field) when a file is missing or malformed, or
// when no row has the metric.
RunData read_run(const std::string& dir, const std::string& metric);

// "SSSF w128 F-nope": the layer pattern, the S window when S layers exist, and the positional encoding
// of the F layers (and of S layers when they are NoPE). Works on a model config JSON.
std::string arch_key(const nlohmann::json& model_config);
// The preset whose architecture (pattern, window, per-type rope) equals the config's, or "".
std::string matching_preset(const nlohmann::json& model_config);

}  // namespace hlm::scaling
