// Scaling-law fits: Huber values, objectives and their gradients against plain double formulas, recovery
// of known constants from noisy synthetic laws, bootstrap determinism, run-folder reading and its
// errors; `scaling fit` and `sweep` end to end (plan validation, dry run, a tiny resumable sweep).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "eval/scaling.h"
#include "model/config.h"
#include "train/run_lock.h"
#include "cli_harness.h"
#include "testing.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace hlm;
using namespace hlm::scaling;

namespace {

const fs::path& tmp_dir() {
  static hlm::testing::ScratchDir d("hlm_scaling_test_");
  return d.path;
}

#ifdef HLM_BINARY
using Result = hlm::testing::CliResult;
Result run(const std::string& args) { return hlm::testing::run_cli_in(tmp_dir(), args); }
void expect_error(const Result& r, const std::string& needle) { hlm::testing::expect_cli_error(r, needle); }
#endif

// Chinchilla's published constants (docs/algorithms.md §9.1).
constexpr double kE = 1.69, kA = 406.4, kB = 410.7, kAlpha = 0.34, kBeta = 0.28;
double chinchilla_law(double n, double d) { return kE + kA / std::pow(n, kAlpha) + kB / std::pow(d, kBeta); }

// A 6 x 6 grid of N in [1e7, 1e10], D in [1e9, 1e12] with multiplicative noise exp(noise * z).
void chinchilla_points(double noise, uint64_t seed, std::vector<double>& N, std::vector<double>& D,
                       std::vector<double>& L) {
  Rng rng(seed);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) {
      const double n = 1e7 * std::pow(1e3, i / 5.0), d = 1e9 * std::pow(1e3, j / 5.0);
      N.push_back(n);
      D.push_back(d);
      L.push_back(chinchilla_law(n, d) * std::exp(noise * rng.normal()));
    }
}

void power_points(double E, double A, double alpha, double noise, uint64_t seed, std::vector<double>& C,
                  std::vector<double>& L) {
  Rng rng(seed);
  for (int i = 0; i < 20; ++i) {
    const double c = 1e12 * std::pow(1e6, i / 19.0);
    C.push_back(c);
    L.push_back((E + A * std::pow(c, -alpha)) * std::exp(noise * rng.normal()));
  }
}

FitOptions small() {
  FitOptions o;
  o.grid = Grid::kSmall;
  return o;
}

}  // namespace

TEST(Scaling, HuberValuesAndDerivative) {
  const double d = 1e-3;
  EXPECT_DOUBLE_EQ(huber(0.0, d), 0.0);
  EXPECT_DOUBLE_EQ(huber(5e-4, d), 0.5 * 5e-4 * 5e-4);              // quadratic inside
  EXPECT_DOUBLE_EQ(huber(3e-3, d), 1e-3 * (3e-3 - 0.5e-3));          // linear outside: 2.5e-6
  EXPECT_DOUBLE_EQ(huber(-3e-3, d), huber(3e-3, d));                 // symmetric
  EXPECT_NEAR(huber(d, d), 0.5e-6, 1e-18);                           // continuous at delta
  EXPECT_NEAR(huber(d * (1 + 1e-12), d), 0.5e-6, 1e-15);
  EXPECT_DOUBLE_EQ(huber(2.0, 0.5), 0.5 * (2.0 - 0.25));
  EXPECT_DOUBLE_EQ(huber_grad(5e-4, d), 5e-4);
  EXPECT_DOUBLE_EQ(huber_grad(3e-3, d), d);
  EXPECT_DOUBLE_EQ(huber_grad(-3e-3, d), -d);
}

TEST(Scaling, ObjectivesMatchPlainFormulaAndFiniteDifferences) {
  std::vector<double> N, D, L;
  chinchilla_points(0.02, 3, N, D, L);
  const double delta = 1e-2;  // a mix of quadratic and linear residuals at this theta
  double th[5] = {6.2, 5.7, 0.45, 0.36, 0.27};
  double want = 0;
  for (size_t i = 0; i < N.size(); ++i) {
    const double pred = std::exp(th[2]) + std::exp(th[0]) / std::pow(N[i], th[3]) + std::exp(th[1]) / std::pow(D[i], th[4]);
    want += huber(std::log(pred) - std::log(L[i]), delta);
  }
  double grad[5];
  EXPECT_NEAR(chinchilla_objective(th, N, D, L, delta, grad), want, 1e-12 * std::max(1.0, want));
  for (int k = 0; k < 5; ++k) {
    std::vector<double> t(th, th + 5);
    const double fd = hlm::testing::fd_grad(t, static_cast<size_t>(k),
                                            [&] { return chinchilla_objective(t.data(), N, D, L, delta, nullptr); }, 1e-6);
    EXPECT_NEAR(grad[k], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "d/dtheta[" << k << "]";
  }

  std::vector<double> C, Y;
  power_points(2.0, 400, 0.15, 0.02, 4, C, Y);
  double tp[3] = {5.5, 0.14, 0.7};
  double wp = 0;
  for (size_t i = 0; i < C.size(); ++i)
    wp += huber(std::log(std::exp(tp[2]) + std::exp(tp[0]) * std::pow(C[i], -tp[1])) - std::log(Y[i]), delta);
  double gp[3];
  EXPECT_NEAR(power_law_objective(tp, C, Y, delta, gp), wp, 1e-12 * std::max(1.0, wp));
  for (int k = 0; k < 3; ++k) {
    std::vector<double> t(tp, tp + 3);
    const double fd =
        hlm::testing::fd_grad(t, static_cast<size_t>(k), [&] { return power_law_objective(t.data(), C, Y, delta, nullptr); }, 1e-6);
    EXPECT_NEAR(gp[k], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "d/dtheta[" << k << "]";
  }
}

TEST(Scaling, ChinchillaRecoversKnownConstantsFromNoisyPoints) {
  std::vector<double> N, D, L;
  chinchilla_points(0.005, 7, N, D, L);  // 0.5% multiplicative noise
  ChinchillaFit f = fit_chinchilla(N, D, L, small());
  EXPECT_EQ(f.n_starts, 3 * 3 * 3 * 3 * 3);
  EXPECT_EQ(f.n_points, 36);
  EXPECT_NEAR(f.alpha, kAlpha, 0.03);
  EXPECT_NEAR(f.beta, kBeta, 0.03);
  EXPECT_NEAR(f.E, kE, 0.05 * kE);
  // The fitted surface reproduces the noise-free law within the noise level everywhere on the grid.
  for (size_t i = 0; i < N.size(); ++i) EXPECT_NEAR(f.predict(N[i], D[i]) / chinchilla_law(N[i], D[i]), 1.0, 0.01);
  // The objective at the optimum is no larger than at the true constants.
  const double truth[5] = {std::log(kA), std::log(kB), std::log(kE), kAlpha, kBeta};
  EXPECT_LE(f.objective, chinchilla_objective(truth, N, D, L, 1e-3, nullptr) * (1 + 1e-9));
  // Compute-optimal allocation is consistent: 6 N_opt D_opt = C.
  EXPECT_NEAR(6 * f.n_opt(1e21) * f.d_opt(1e21) / 1e21, 1.0, 1e-9);
}

TEST(Scaling, ChinchillaNoiseFreeIsExact) {
  std::vector<double> N, D, L;
  chinchilla_points(0.0, 1, N, D, L);
  ChinchillaFit f = fit_chinchilla(N, D, L, small());
  EXPECT_LT(f.objective, 1e-20);
  EXPECT_NEAR(f.alpha, kAlpha, 1e-4);
  EXPECT_NEAR(f.beta, kBeta, 1e-4);
  EXPECT_NEAR(f.E / kE, 1.0, 1e-4);
  EXPECT_NEAR(f.A / kA, 1.0, 1e-3);
  EXPECT_NEAR(f.B / kB, 1.0, 1e-3);
}

TEST(Scaling, PowerLawRecoversKnownConstants) {
  std::vector<double> C, L;
  power_points(2.0, 400, 0.15, 0.005, 11, C, L);
  PowerLawFit f = fit_power_law(C, L);  // the reference grid: 5 x 5 x 6 starts
  EXPECT_EQ(f.n_starts, 150);
  EXPECT_NEAR(f.alpha, 0.15, 0.03);
  EXPECT_NEAR(f.E, 2.0, 0.05 * 2.0);
  for (size_t i = 0; i < C.size(); ++i) EXPECT_NEAR(f.predict(C[i]) / (2.0 + 400 * std::pow(C[i], -0.15)), 1.0, 0.01);
  PowerLawFit s = fit_power_law(C, L, small());
  EXPECT_EQ(s.n_starts, 27);
  EXPECT_NEAR(s.objective, f.objective, 1e-6 * f.objective);  // both grids find the same optimum

  std::vector<double> C0, L0;
  power_points(2.0, 400, 0.15, 0.0, 1, C0, L0);
  PowerLawFit e = fit_power_law(C0, L0, small());
  EXPECT_LT(e.objective, 1e-20);
  EXPECT_NEAR(e.alpha, 0.15, 1e-4);
  EXPECT_NEAR(e.E / 2.0, 1.0, 1e-4);
  EXPECT_NEAR(e.A / 400, 1.0, 1e-3);
}

TEST(Scaling, LogLongPplFitAndInputErrors) {
  // log LongPPL = 1.2 + 60 C^-0.2 (a log-perplexity that falls towards 1.2 nats with compute).
  std::vector<double> C, Y;
  power_points(1.2, 60, 0.2, 0.003, 5, C, Y);
  PowerLawFit f = fit_log_longppl(C, Y, small());
  EXPECT_NEAR(f.alpha, 0.2, 0.03);
  EXPECT_NEAR(f.E, 1.2, 0.05 * 1.2);
  std::vector<double> bad = Y;
  bad[3] = 0.0;
  EXPECT_THROW(fit_log_longppl(C, bad, small()), Error);
  try {
    fit_power_law({1, 2}, {3, 4});
    FAIL() << "2 points accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 points, need at least 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fit_power_law({1, 2, 3}, {3, 4}), Error);
  EXPECT_THROW(fit_power_law({1, -2, 3}, {3, 4, 5}), Error);
  EXPECT_THROW(fit_chinchilla({1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}), Error);
}

TEST(Scaling, LowerFrontier) {
  //              0     1    2    3    4     5    6
  std::vector<double> x = {1, 2, 2, 4, 8, 0, 16};
  std::vector<double> y = {5, 4, 3.5, 3.6, 3, 1, 3};
  auto idx = lower_frontier(x, y);  // x = 0 dropped; (2,4) dominated by (2,3.5); (4,3.6) above 3.5; (16,3) ties 3
  EXPECT_EQ(idx, (std::vector<size_t>{0, 2, 4}));
}

TEST(Scaling, BootstrapIsDeterministicBySeed) {
  // 8 "runs" of 4 points each along one power law.
  std::vector<double> C, L;
  std::vector<int> unit;
  Rng rng(9);
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 4; ++k) {
      const double c = 1e12 * std::pow(10.0, r * 0.7 + k * 0.2);
      C.push_back(c);
      L.push_back((2.0 + 400 * std::pow(c, -0.15)) * std::exp(0.01 * rng.normal()));
      unit.push_back(r);
    }
  PowerLawFit full = fit_power_law(C, L, small());
  BootstrapSummary a = bootstrap_power_law(unit, C, L, full, 8, 42, small());
  BootstrapSummary b = bootstrap_power_law(unit, C, L, full, 8, 42, small());
  BootstrapSummary c = bootstrap_power_law(unit, C, L, full, 8, 43, small());
  ASSERT_EQ(a.constants.size(), 3u);
  EXPECT_EQ(a.to_json().dump(), b.to_json().dump());
  EXPECT_NE(a.to_json().dump(), c.to_json().dump());
  EXPECT_EQ(a.resamples, 8);
  EXPECT_EQ(a.failed, 0);
  const auto& al = a.constants[2];
  EXPECT_EQ(al.name, "alpha");
  EXPECT_DOUBLE_EQ(al.value, full.alpha);
  EXPECT_GT(al.std, 0.0);
  EXPECT_LE(al.p05, al.mean);
  EXPECT_GE(al.p95, al.mean);
  EXPECT_NEAR(al.mean, 0.15, 0.05);

  // The generic bootstrap: one unit is always drawn, so every statistic equals its value.
  BootstrapSummary one = bootstrap(1, 5, 0, {"x"}, {3.0}, [](const std::vector<int>& d) {
    return std::vector<double>{3.0 + static_cast<double>(d[0])};
  });
  EXPECT_DOUBLE_EQ(one.constants[0].mean, 3.0);
  EXPECT_DOUBLE_EQ(one.constants[0].std, 0.0);
  EXPECT_DOUBLE_EQ(one.constants[0].p05, 3.0);
  // Mean over draws of a unit's index: percentiles interpolate between order statistics.
  BootstrapSummary m = bootstrap(2, 40, 5, {"k"}, {0.5}, [](const std::vector<int>& d) {
    return std::vector<double>{0.5 * (d[0] + d[1])};
  });
  EXPECT_DOUBLE_EQ(m.constants[0].p05, 0.0);
  EXPECT_DOUBLE_EQ(m.constants[0].p95, 1.0);
  EXPECT_EQ(points_of_draw({0, 0, 1, 2}, {2, 0, 2}), (std::vector<size_t>{3, 0, 1, 3}));
}

namespace {

json tiny_config(const std::string& preset, int d_model) {
  json j = preset_json(preset);
  j["d_model"] = d_model;
  j["n_layers"] = 4;
  return ModelConfig::from_json(j, "test").to_json();
}

// A run folder whose evaluation rows follow the Chinchilla law at N = matmul_params, D = tokens.
fs::path write_run(const std::string& name, const json& cfg, double n, const std::vector<double>& tokens,
                   const std::string& extra_lines = "") {
  const fs::path d = tmp_dir() / "runs" / name;
  fs::create_directories(d);
  std::ofstream(d / "config.json") << cfg.dump(2);
  std::ofstream m(d / "metrics.jsonl");
  m << json({{"step", 0}, {"val_loss", 8.3}, {"tokens", 0}, {"flops", 0}, {"params", n * 1.3}, {"matmul_params", n}})
           .dump()
    << "\n";
  long step = 0;
  for (double t : tokens) {
    step += 10;
    m << json({{"step", step}, {"loss", 3.0}, {"lr", 1e-3}, {"tokens", t}, {"flops", 6 * n * t}}).dump() << "\n";
    m << json({{"step", step}, {"val_loss", chinchilla_law(n, t)}, {"tokens", t}, {"flops", 6 * n * t},
               {"params", n * 1.3}, {"matmul_params", n}, {"longppl", std::exp(2 * chinchilla_law(n, t))}})
             .dump()
      << "\n";
  }
  m << extra_lines;
  return d;
}

}  // namespace

TEST(Scaling, ReadRunDedupesStepsAndNamesBadFiles) {
  const json cfg = tiny_config("swa128-nope", 64);
  EXPECT_EQ(arch_key(cfg), "SSSF w128 F-nope");
  EXPECT_EQ(matching_preset(cfg), "swa128-nope");
  EXPECT_EQ(arch_key(tiny_config("mamba2", 64)), "MMMF F-rope");
  json odd = cfg;
  odd["window"] = 96;
  odd["layer_types"]["S"]["window"] = 96;
  EXPECT_EQ(matching_preset(odd), "");

  // A resumed run re-logged step 20: the last row of a step wins.
  const std::string again =
      json({{"step", 20}, {"val_loss", 4.25}, {"tokens", 2e9}, {"flops", 1.0}, {"params", 1.0}, {"matmul_params", 1.0}})
          .dump() +
      "\n";
  const fs::path d = write_run("read1", cfg, 1e8, {1e9, 2e9, 4e9}, again);
  RunData r = read_run(d.string(), "val_loss");
  ASSERT_EQ(r.points.size(), 4u);
  EXPECT_EQ(r.points[0].step, 0);
  EXPECT_EQ(r.points[2].step, 20);
  EXPECT_DOUBLE_EQ(r.points[2].value, 4.25);
  EXPECT_DOUBLE_EQ(r.points[3].tokens, 4e9);
  EXPECT_EQ(r.arch, "SSSF w128 F-nope");
  EXPECT_EQ(r.name, "read1");
  RunData lp = read_run(d.string(), "log_longppl");  // from "longppl"; the step-0 row has none
  ASSERT_EQ(lp.points.size(), 3u);
  EXPECT_EQ(lp.points[0].step, 10);
  EXPECT_NEAR(lp.points[2].value, 2 * chinchilla_law(1e8, 4e9), 1e-12);

  auto expect_read_error = [](const fs::path& dir, const std::string& metric, const std::string& needle) {
    try {
      read_run(dir.string(), metric);
      ADD_FAILURE() << "no error for " << dir;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_read_error(tmp_dir() / "runs" / "nope", "val_loss", "runs/nope: no such run folder");
  const fs::path bad = write_run("bad1", cfg, 1e8, {1e9}, "{\"step\": 30, \"val_loss\": \n");
  expect_read_error(bad, "val_loss", "bad1/metrics.jsonl:4: malformed JSON");
  const fs::path nof = write_run("bad2", cfg, 1e8, {1e9}, "{\"step\": 30, \"val_loss\": 3.1, \"tokens\": 5}\n");
  expect_read_error(nof, "val_loss", "bad2/metrics.jsonl:4: evaluation row has no numeric 'flops'");
  expect_read_error(d, "log_longppl_x", "no evaluation row has a numeric 'log_longppl_x'");
  const fs::path nolp = tmp_dir() / "runs" / "bad3";
  fs::create_directories(nolp);
  std::ofstream(nolp / "config.json") << cfg.dump();
  expect_read_error(nolp, "val_loss", "bad3/metrics.jsonl: missing");
  std::ofstream(nolp / "metrics.jsonl") << json({{"step", 1}, {"loss", 3.0}}).dump() << "\n";
  expect_read_error(nolp, "val_loss", "no evaluation rows");
  fs::remove(nolp / "config.json");
  expect_read_error(nolp, "val_loss", "bad3/config.json: missing");
}

// The CLI end to end (not in the sanitized reader tests, which build without the CLI).
#ifdef HLM_BINARY

TEST(ScalingCli, FitGroupsRunsRecoversConstantsAndPlots) {
  // Two architectures; arch A has 6 sizes x 1 budget with 3 evaluations each along the Chinchilla law.
  const fs::path root = tmp_dir() / "fit";
  std::string args;
  for (int s = 0; s < 6; ++s) {
    const double n = 1e7 * std::pow(1e3, s / 5.0);
    std::vector<double> tok;
    for (int k = 0; k < 3; ++k) tok.push_back(1e9 * std::pow(10.0, s * 0.5 + k * 0.4));
    args += " " + write_run("fitA" + std::to_string(s), tiny_config("swa128", 64), n, tok).string();
  }
  for (int s = 0; s < 2; ++s)
    args += " " + write_run("fitB" + std::to_string(s), tiny_config("gdn", 64), 1e8 * (s + 1), {1e9, 3e9, 1e10}).string();
  const std::string svg = (tmp_dir() / "fit.svg").string();
  Result r = run("scaling fit" + args + " --grid small --bootstrap 4 --seed 3 --json --threads 2 --plot " + svg);
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["groups"].size(), 2u);
  const json& a = j["groups"][0];
  EXPECT_EQ(a["name"], "SSSF w128 F-rope");
  EXPECT_EQ(a["runs"].size(), 6u);
  // Chinchilla on the 6 final points: exact data, so the constants come back.
  ASSERT_TRUE(a["chinchilla"].is_object()) << a.dump();
  EXPECT_NEAR(a["chinchilla"]["E"].get<double>(), kE, 0.05 * kE);
  EXPECT_EQ(a["chinchilla"]["bootstrap"]["resamples"], 4);
  ASSERT_TRUE(a["power_law"].is_object());
  EXPECT_GT(a["power_law"]["alpha"].get<double>(), 0.0);
  EXPECT_EQ(a["power_law"]["bootstrap"]["unit"], "run");
  const json& b = j["groups"][1];
  EXPECT_EQ(b["name"], "GGGF F-rope");
  EXPECT_TRUE(b["chinchilla"].is_null());
  EXPECT_NE(b["chinchilla_skipped"].get<std::string>().find("need 5"), std::string::npos);
  EXPECT_EQ(b["power_law"]["bootstrap"]["unit"], "point");  // two runs: resample points
  EXPECT_TRUE(fs::exists(svg));
  // The same seed gives the same bootstrap.
  Result r2 = run("scaling fit" + args + " --grid small --bootstrap 4 --seed 3 --json --threads 1");
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(json::parse(r2.out)["groups"][0]["power_law"]["bootstrap"].dump(), a["power_law"]["bootstrap"].dump());

  // --group-by preset uses the preset names; text output names the constants.
  Result t = run("scaling fit" + args + " --grid small --bootstrap 0 --group-by preset");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("swa128: 6 runs"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("gdn: 2 runs"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("L(N, D) = E + A/N^alpha + B/D^beta"), std::string::npos) << t.out;

  expect_error(run("scaling fit " + (tmp_dir() / "runs" / "missing").string()), "missing: no such run folder");
  expect_error(run("scaling fit" + args + " --metric log_longppl_x --bootstrap 0"), "no evaluation row has a numeric");
  expect_error(run("scaling fit" + args + " --group-by size"), "--group-by must be");
}

namespace {
fs::path write_plan(const std::string& name, const json& plan) {
  const fs::path p = tmp_dir() / (name + ".json");
  std::ofstream(p) << plan.dump(2);
  return p;
}
json base_plan() {
  return {{"out", (tmp_dir() / "sweep1").string()},
          {"data", (tmp_dir() / "corpus").string()},
          {"tokenizer", "byte"},
          {"archs", {"swa128", {{"name", "nope8"}, {"preset", "swa128-nope"}, {"set", {"window=8"}}}}},
          {"sizes",
           {{{"name", "s1"}, {"set", {"d_model=32", "n_layers=2", "n_heads=2", "n_kv_heads=2", "head_dim=16", "d_ff=64",
                                      "max_seq_len=64"}}},
            {{"name", "s2"}, {"set", {"d_model=48", "n_layers=2", "n_heads=2", "n_kv_heads=2", "head_dim=16", "d_ff=96",
                                      "max_seq_len=64"}}}}},
          {"budgets", {2, 3}},
          {"train", {{"batch", 2}, {"seq_len", 32}, {"lr", 0.003}, {"eval_every", 1}, {"eval_batches", 1},
                     {"threads", 1}, {"quiet", true}}}};
}
}  // namespace

TEST(SweepCli, PlanValidationErrorsNameFileAndField) {
  auto check = [](const std::string& name, const std::function<void(json&)>& edit, const std::string& needle) {
    json p = base_plan();
    edit(p);
    const fs::path f = write_plan(name, p);
    Result r = run("sweep " + f.string() + " --dry-run");
    expect_error(r, f.string());
    expect_error(r, needle);
  };
  check("p_out", [](json& p) { p.erase("out"); }, "field 'out' is missing");
  check("p_unknown", [](json& p) { p["budget"] = 3; }, "unknown field 'budget'");
  check("p_preset", [](json& p) { p["archs"][0] = "swa99"; }, "field 'archs[0]': unknown preset 'swa99'");
  check("p_archobj", [](json& p) { p["archs"][1]["windw"] = 3; }, "unknown field 'archs[1].windw'");
  check("p_budget", [](json& p) { p["budgets"][1] = -5; }, "field 'budgets[1]' must be a positive whole number");
  check("p_unit", [](json& p) { p["budget_unit"] = "flops"; }, "field 'budget_unit'");
  check("p_train", [](json& p) { p["train"]["batchsize"] = 4; }, "field 'train.batchsize': `hybridlm train` has no option --batchsize");
  check("p_steps", [](json& p) { p["train"]["steps"] = 4; }, "field 'train.steps' is set by the sweep");
  check("p_flag", [](json& p) { p["train"]["quiet"] = 1; }, "field 'train.quiet' is a switch");
  check("p_dup", [](json& p) { p["sizes"][1]["name"] = "s1"; }, "field 'sizes[1].name': \"s1\" is used twice");
  check("p_both", [](json& p) { p["sizes"][0]["set"].push_back("window=4"); }, "both set 'window'");
  check("p_key", [](json& p) { p["sizes"][1]["set"].push_back("d_modle=3"); },
        "archs[0] (swa128) x sizes[1] (s2): preset 'swa128' (with --set overrides): unknown config key 'd_modle'");
  check("p_name", [](json& p) { p["archs"][1]["name"] = "a/b"; }, "field 'archs[1].name' \"a/b\"");
  expect_error(run("sweep " + (tmp_dir() / "no_plan.json").string()), "no_plan.json: cannot open the plan file");
}

TEST(SweepCli, DryRunListsTheRunsAndTokenBudgets) {
  const fs::path f = write_plan("dry", base_plan());
  Result r = run("sweep " + f.string() + " --dry-run --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  std::vector<std::string> names;
  for (auto& e : j["runs"]) names.push_back(e["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"swa128-s1-2", "swa128-s1-3", "swa128-s2-2", "swa128-s2-3", "nope8-s1-2",
                                             "nope8-s1-3", "nope8-s2-2", "nope8-s2-3"}));
  EXPECT_EQ(j["runs"][1]["steps"], 3);
  EXPECT_EQ(j["runs"][1]["status"], "pending");
  EXPECT_DOUBLE_EQ(j["runs"][1]["tokens"].get<double>(), 3 * 2 * 32);
  const std::string cmd = j["runs"][4]["command"];
  for (const char* s : {"train --preset swa128-nope --set window=8 --set d_model=32", "--steps 2", "--batch 2",
                        "--lr 0.003", "--quiet", "--tokenizer byte", "sweep1/nope8-s1-2"})
    EXPECT_NE(cmd.find(s), std::string::npos) << s << " not in " << cmd;
  EXPECT_FALSE(fs::exists(tmp_dir() / "sweep1"));  // a dry run writes nothing

  json p = base_plan();
  p["budget_unit"] = "tokens";
  p["budgets"] = {1000, 2000000};
  Result t = run("sweep " + write_plan("dry_tok", p).string() + " --dry-run --json");
  ASSERT_EQ(t.code, 0) << t.err;
  json tj = json::parse(t.out);
  EXPECT_EQ(tj["runs"][0]["name"], "swa128-s1-1ktok");
  EXPECT_EQ(tj["runs"][0]["steps"], 16);  // ceil(1000 / (2 * 32))
  EXPECT_EQ(tj["runs"][1]["name"], "swa128-s1-2Mtok");
  Result text = run("sweep " + f.string() + " --dry-run");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("8 runs"), std::string::npos) << text.out;
}

namespace {
// The text base_plan trains on, and a data cache inside the scratch folder.
void make_sweep_corpus() {
  fs::create_directories(tmp_dir() / "corpus");
  for (int i = 0; i < 4; ++i) {
    std::ofstream f(tmp_dir() / "corpus" / ("doc" + std::to_string(i) + ".txt"));
    for (int k = 0; k < 60; ++k) f << "Document " << i << " line " << k << ": the quick brown fox jumps.\n";
  }
  ::setenv("HLM_DATA_CACHE", (tmp_dir() / "cache").c_str(), 1);
}
}  // namespace

TEST(SweepCli, TrainsSkipsFinishedRunsAndResumes) {
  make_sweep_corpus();
  json p = base_plan();
  p["out"] = (tmp_dir() / "sweep2").string();
  p["archs"] = json::array({p["archs"][1]});  // not `= {x}`: clang reads a one-element brace as a copy of x
  p["sizes"] = json::array({p["sizes"][0]});
  const fs::path f = write_plan("real", p);
  Result r = run("sweep " + f.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  for (auto& e : j["runs"]) {
    EXPECT_EQ(e["status"], "done") << e.dump();
    EXPECT_TRUE(e["final_val_loss"].is_number()) << e.dump();
  }
  const fs::path sj = tmp_dir() / "sweep2" / "sweep.json";
  ASSERT_TRUE(fs::exists(sj));

  // Pretend the second run stopped early: lower its budget... instead raise the plan's budget to 4 so it
  // resumes from its step-3 checkpoint, and the 2-step run is skipped.
  p["budgets"] = {2, 4};
  const fs::path f2 = write_plan("real2", p);
  Result dry = run("sweep " + f2.string() + " --dry-run --json");
  ASSERT_EQ(dry.code, 0) << dry.err;
  json dj = json::parse(dry.out);
  EXPECT_EQ(dj["runs"][0]["status"], "done");
  EXPECT_EQ(dj["runs"][1]["name"], "nope8-s1-4");
  EXPECT_EQ(dj["runs"][1]["status"], "pending");
  EXPECT_FALSE(dj["runs"][1].contains("resume_from_step"));  // a new folder: 4 is another run name
  // A run folder past the plan is an error, and a finished sweep re-run skips everything.
  Result again = run("sweep " + f.string() + " --json");
  ASSERT_EQ(again.code, 0) << again.err;
  // Named first: a range-for over `json::parse(...)["runs"]` iterates a temporary already destroyed (ASan).
  const json again_json = json::parse(again.out);
  for (auto& e : again_json["runs"]) EXPECT_FALSE(e.contains("exit_code")) << e.dump();

  // Simulate an interrupted run: copy the 3-step run's folder to the 4-step name, then resume it.
  fs::copy(tmp_dir() / "sweep2" / "nope8-s1-3", tmp_dir() / "sweep2" / "nope8-s1-4", fs::copy_options::recursive);
  Result dry2 = run("sweep " + f2.string() + " --dry-run --json");
  ASSERT_EQ(dry2.code, 0) << dry2.err;
  EXPECT_EQ(json::parse(dry2.out)["runs"][1]["resume_from_step"], 3);
  Result res = run("sweep " + f2.string() + " --json");
  ASSERT_EQ(res.code, 0) << res.err;
  json rj = json::parse(res.out);
  EXPECT_EQ(rj["runs"][1]["status"], "done");
  EXPECT_NE(rj["runs"][1]["command"].get<std::string>().find("--resume"), std::string::npos);
  RunData rd = read_run((tmp_dir() / "sweep2" / "nope8-s1-4").string(), "val_loss");
  EXPECT_EQ(rd.points.back().step, 4);

  // A plan whose model differs from an existing folder is refused, naming the field.
  json q = p;
  q["sizes"][0]["set"][0] = "d_model=64";
  expect_error(run("sweep " + write_plan("real3", q).string() + " --dry-run"), "field 'd_model' is 32");
  // The sweep folder feeds `scaling fit` (two runs: too few for L(N, D), enough points for L(C)).
  Result fit = run("scaling fit " + (tmp_dir() / "sweep2").string() + " --grid small --bootstrap 0 --json");
  ASSERT_EQ(fit.code, 0) << fit.err;
  json fj = json::parse(fit.out);
  ASSERT_EQ(fj["groups"].size(), 1u);
  EXPECT_EQ(fj["groups"][0]["name"], "SSSF w8 F-nope");
}

// --jobs 2: two trainings at a time, each told its share of the CPUs (--threads), all four runs done. Without
// OMP_NUM_THREADS: where it is set, it decides each training's threads and sweep adds no --threads (by design).
TEST(SweepCli, JobsTrainsSeveralRunsAtOnce) {
  make_sweep_corpus();
  json p = base_plan();
  p["out"] = (tmp_dir() / "sweep_jobs").string();
  p["train"].erase("threads");
  p["sizes"] = json::array({p["sizes"][0]});
  Result r = hlm::testing::run_cli_in(tmp_dir(), "sweep " + write_plan("jobs", p).string() + " --jobs 2 --json",
                                      "env -u OMP_NUM_THREADS ");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 4u);
  for (auto& e : j["runs"]) {
    EXPECT_EQ(e["status"], "done") << e.dump();
    EXPECT_NE(e["command"].get<std::string>().find("--threads "), std::string::npos) << e.dump();
  }
  expect_error(run("sweep " + write_plan("jobs0", p).string() + " --jobs 0"), "--jobs");
}

// A run killed before its first checkpoint left run.json, config.json and metrics rows: it starts over (the
// rows set aside), and the sweep first waits for a trainer still holding the folder's lock (one of a killed
// sweep, saving on its way out) instead of failing on it.
TEST(SweepCli, RunNeverCheckpointedStartsOverAfterTheLockIsFree) {
  make_sweep_corpus();
  json p = base_plan();
  const fs::path out = tmp_dir() / "sweep_partial";
  fs::remove_all(out);
  p["out"] = out.string();
  p["archs"] = json::array({p["archs"][1]});
  p["sizes"] = json::array({p["sizes"][0]});
  p["budgets"] = {2};
  const fs::path f = write_plan("partial", p);
  const fs::path dir = out / "nope8-s1-2";
  fs::create_directories(dir);
  for (const char* name : {"run.json", "config.json", "metrics.jsonl"}) std::ofstream(dir / name) << "{}\n";
  // Another process holds the run's lock for a second, as a dying trainer would.
  const pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    { RunLock lock(dir.string()); ::usleep(1000 * 1000); }
    ::_exit(0);
  }
  ::usleep(200 * 1000);
  Result r = run("sweep " + f.string() + " --json");
  int st = 0;
  ::waitpid(holder, &st, 0);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["status"], "done") << j.dump();
  EXPECT_EQ(j["runs"][0]["command"].get<std::string>().find("--resume"), std::string::npos);
  bool set_aside = false;
  for (auto& e : fs::directory_iterator(dir)) set_aside |= e.path().filename().string().starts_with("metrics.jsonl.stale-");
  EXPECT_TRUE(set_aside);
  EXPECT_EQ(read_run(dir.string(), "val_loss").points.back().step, 2);
}

#endif  // HLM_BINARY
