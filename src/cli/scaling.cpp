// hybridlm scaling fit RUN...: scaling-law fits over many training runs (docs/scaling.md); the policy
// (grouping, points, when to fit, bootstrap) lives in study/scaling_fit.h. Prints text or JSON, plots an SVG.
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
#include "study/scaling_fit.h"

namespace hlm::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct FitOpts {
  std::vector<std::string> runs;
  study::FitPolicy policy;
  std::string plot;
  bool json = false;
  int threads = 0;
};

int run_fit(const FitOpts& o) {
  apply_threads(o.threads);
  const study::FitPolicy& p = o.policy;
  study::check_fit_policy(p);
  if (!o.plot.empty() && fs::path(o.plot).extension() != ".svg") fail("--plot {}: the plot is an .svg file", o.plot);
  Timer timer;
  study::FitResult r = study::fit_runs(study::expand_runs(o.runs), p, o.json);
  if (!o.plot.empty()) {
    LinePlot plot{p.metric + " vs training compute", "training FLOPs", p.metric, true, true, {}};
    for (auto& s : r.points) plot.series.push_back(s);
    for (auto& s : r.fits) plot.series.push_back(s);
    write_line_plot(plot, o.plot);
  }
  if (o.json) {
    print_json({{"metric", p.metric}, {"group_by", p.group_by}, {"points", p.points}, {"grid", p.grid},
                {"bootstrap", p.bootstrap}, {"seed", p.seed}, {"groups", r.groups}, {"skipped_runs", r.skipped_runs},
                {"plot", o.plot.empty() ? json(nullptr) : json(o.plot)}, {"seconds", timer.seconds()}});
  } else {
    fmt::print("{}", r.text);
    if (p.bootstrap > 0)
      fmt::print("[lo, hi]: 5-95% bootstrap interval over {} resamples (seed {})\n", p.bootstrap, p.seed);
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
  f->add_option("--metric", o->policy.metric, "evaluation field to fit: val_loss | log_longppl (or any numeric eval field)")
      ->capture_default_str();
  f->add_option("--group-by", o->policy.group_by, "pattern (architecture key) | preset (sweep arch / preset name) | run")
      ->capture_default_str();
  f->add_option("--points", o->policy.points,
                "L(C) points: frontier (lower envelope of all evaluations) | final (each run's last) | all")
      ->capture_default_str();
  f->add_option("--params", o->policy.params, "N for L(N, D): matmul (non-embedding) | total")->capture_default_str();
  f->add_option("--bootstrap", o->policy.bootstrap, "bootstrap resamples (0 = off)")->capture_default_str()
      ->check(in_range(0, 1e6));
  f->add_option("--seed", o->policy.seed, "bootstrap seed")->capture_default_str()
      ->check(seed_range());
  f->add_option("--grid", o->policy.grid, "L-BFGS start grid: full (reference, 4500 starts for L(N, D)) | small")
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
