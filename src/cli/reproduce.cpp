// hybridlm reproduce [PLAN] --budget tiny|small|medium --out DIR: the paper's study in one command
// (study/reproduce.h does the work; plan format, verdict rules and budgets: docs/reproduce.md).
#include <memory>
#include <set>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "study/reproduce.h"
#include "train/distributed.h"

namespace hlm::cli {

namespace {

using nlohmann::json;

// 1.23e+18 -> "1.23E"; 4.5e9 -> "4.50G"; 135 -> "135".
std::string si(double x) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (x >= 1000 && i < 6) x /= 1000, ++i;
  return fmt::format("{:.{}f}{}", x, x < 10 ? 2 : x < 100 ? 1 : 0, prefix[i]);
}

void print_dry_run(const json& d) {
  const json& data = d["data"];
  const int first = d["first_seed"].get<int>();
  fmt::print("reproduce --dry-run: plan {} ({}), budget {}, findings {}, {} seed(s){}, {}, {} job(s) x {} thread(s); "
             "into {}\n",
             d["plan"].get<std::string>(), d["name"].get<std::string>(), d["budget"].get<std::string>(),
             fmt::join(d["findings"].get<std::vector<std::string>>(), ","), d["seeds"].get<int>(),
             first == 1 ? "" : fmt::format(" ({}..{})", first, first + d["seeds"].get<int>() - 1),
             d["precision"].get<std::string>(), d["jobs"].get<int>(), d["threads"].get<int>(),
             d["out"].get<std::string>());
  fmt::print("data: {} with {} ({}): {} training tokens, vocab {}; LongPPL reads {} validation document(s) of {} "
             "tokens (the budget asks for up to {})\n",
             data["spec"].get<std::string>(), data["tokenizer"].get<std::string>(), data["dir"].get<std::string>(),
             data["train_tokens"].get<long>(), data["vocab"].get<long>(), data["longppl_docs"].get<int>(),
             data["doc_len"].get<long>(), data["longppl_docs_asked"].get<int>());
  const bool measured = d["measured"].is_object();
  fmt::print("{:<26} {:<12} {:>6} {:>7} {:>9} {:>8} {:>11} {:>11} {:>9}  {}\n", "run", "preset", "window", "steps",
             "tokens", "params", "train FLOP", "text passes", measured ? "tok/s" : "", "on disk");
  for (auto& r : d["runs"]) {
    const long window = r["window"].get<long>();
    fmt::print("{:<26} {:<12} {:>6} {:>7} {:>9} {:>8} {:>11} {:>11.2f} {:>9}  {}\n", r["name"].get<std::string>(),
               r["preset"].get<std::string>(), window > 0 ? std::to_string(window) : "-", r["steps"].get<long>(),
               si(r["tokens"].get<double>()), si(r["params"].get<double>()),
               si(r["train_flops"].get<double>()), r["text_passes"].get<double>(),
               measured ? fmt::format("{:.0f}", r["tokens_per_s"].get<double>()) : "", r["on_disk"].get<std::string>());
  }
  std::string tasks;
  for (auto& [kind, n] : d["tasks"].items())
    tasks += fmt::format("{}{} {} ({} done)", tasks.empty() ? "" : ", ", n[0].get<int>(), kind, n[1].get<int>());
  const json& t = d["total"];
  fmt::print("tasks: {}\ntotal: {} runs, {} training tokens, {} FLOP of training; {} tasks\n", tasks,
             t["runs"].get<int>(), si(t["tokens"].get<double>()), si(t["train_flops"].get<double>()),
             t["tasks"].get<int>());
  if (measured) {
    const json& m = d["measured"];
    const double left = m["train_seconds_left"].get<double>();
    fmt::print("measured here ({}, {} kernels; each model alone, {} thread(s)): the training left is {:.1f} job-hours, "
               "{:.1f} h of wall time with {} job(s) at once taking the runs in order (evaluations and probes not "
               "counted)\n",
               m["cpu"].get<std::string>(), m["simd"].get<std::string>(), d["threads"].get<int>(), left / 3600,
               m["wall_seconds_left"].get<double>() / 3600, d["jobs"].get<int>());
  }
  // More than one pass over the training text: the runs repeat the data (a bigger corpus: the budget's `data`).
  double most = 0;
  for (auto& r : d["runs"]) most = std::max(most, r["text_passes"].get<double>());
  if (most > 1)
    fmt::print("note: runs see the training text up to {:.1f} times; give the budget a bigger corpus (`data`) for "
               "runs that do not repeat it\n", most);
}

// --sample-size: per finding, the pooled pilot, then how often a fresh sample of n seeds reads each verdict.
void print_sample_size(const json& r) {
  fmt::print("sample size (a planning figure, not a result): each finding's seeds modelled as normal with the mean "
             "and sd below, the plan's rule applied to {} simulated fresh samples per seed count\n",
             r["draws"].get<int>());
  for (auto& f : r["findings"]) {
    fmt::print("\n{}. {}\n", f["id"].get<std::string>(), f["title"].get<std::string>());
    if (f.contains("model")) {
      const json& m = f["model"];
      const auto sd = [](const json& s) {
        const std::string sd = s["sd"].is_number() ? fmt::format("{:.3g}", s["sd"].get<double>()) : "unknown";
        return fmt::format("{:+.4g} (sd {}, {} seeds)", s["mean"].get<double>(), sd, s["n"].get<int>());
      };
      fmt::print("   effect {}, margin {:g}; ", sd(m["effect"]), m["margin"].get<double>());
      if (m.contains("limited"))
        fmt::print("{} {}, at most {:g}; ", m["limited_name"].get<std::string>(), sd(m["limited"]),
                   m["limit"].get<double>());
      if (m["interval"] == "t")
        fmt::print("one-sided {:g}% t bounds\n", 100 * m["confidence"].get<double>());
      else
        fmt::print("the seeds' range\n");
      for (auto& s : f["sources"])
        fmt::print("   from {}: {}\n", s["path"].get<std::string>(), sd(s["effect"]));
    }
    if (f.contains("odds")) {
      fmt::print("   {:>6} {:>8} {:>14} {:>13}\n", "seeds", "holds", "does not hold", "inconclusive");
      for (auto& o : f["odds"])
        fmt::print("   {:>6} {:>7.1f}% {:>13.1f}% {:>12.1f}%\n", o["seeds"].get<int>(), 100 * o["holds"].get<double>(),
                   100 * o["does_not_hold"].get<double>(), 100 * o["inconclusive"].get<double>());
      const int n = f["seeds_for_decided"].get<int>();
      const double p = 100 * f["decided"].get<double>();
      if (n > 0)
        fmt::print("   a fresh sample decides it (holds or does not hold) {:g}% of the time from {} seeds\n", p, n);
      else if (f["model"]["interval"] == "t")
        fmt::print("   no sample of up to 200 seeds decides it {:g}% of the time\n", p);
    }
    if (f.contains("note")) fmt::print("   note: {}\n", f["note"].get<std::string>());
  }
}

}  // namespace

Command register_reproduce(CLI::App& app) {
  auto* sub = app.add_subcommand("reproduce", "the paper's study: train, evaluate, probe, fit, and write a report "
                                              "with a verdict per finding");
  auto o = std::make_shared<study::ReproduceOptions>();
  auto json_out = std::make_shared<bool>(false);
  sub->add_option("plan", o->plan, "study plan JSON (default: studies/paper.json of the source tree)");
  sub->add_option("--budget", o->budget, "a budget of the plan: tiny | small | medium")->capture_default_str();
  sub->add_option("--only", o->only, "findings to run, e.g. b or a,c (default: all)")->delimiter(',');
  sub->add_option("--seeds", o->seeds,
                  "seeds per hybrid (default: the budget's, or the folder's on a rerun; more than the folder holds "
                  "adds the missing seeds)");
  sub->add_option("--first-seed", o->first_seed,
                  "seeds are N, N+1, ... (default 1, or the folder's on a rerun): a fresh sample of seeds, e.g. to "
                  "confirm a finding with seeds no earlier study has seen")
      ->check(CLI::Range(1, 1000000000));
  sub->add_option("--jobs", o->jobs, "child processes at once (default: one per core; each gets cores/jobs threads)");
  add_precision_flag(sub, &o->precision);
  sub->add_option("--out", o->out, "study folder: runs/, findings.json, report.md, figures")->required();
  sub->add_flag("--report-only", o->report_only, "rewrite report.md and the figures from DIR/findings.json alone");
  sub->add_flag("--sample-size", o->sample_size,
                "how often a fresh sample of n seeds would decide each finding, simulated from the seeds in "
                "DIR/findings.json (and --pilot folders); runs nothing, writes nothing");
  sub->add_option("--pilot", o->pilots, "with --sample-size: another study folder whose seeds are pooled with DIR's")
      ->needs("--sample-size");
  sub->add_flag("--dry-run", o->dry_run,
                "list the runs (size, tokens, training FLOPs, passes over the data, what is on disk) and tasks, and "
                "what LongPPL can read of the data; prepares the dataset, trains nothing, writes nothing into DIR");
  sub->add_flag("--measure", o->measure,
                "with --dry-run: time a few training steps of each model here (hybridlm bench, the study's threads "
                "and precision) and estimate the training time left")
      ->needs("--dry-run");
  sub->get_option("--sample-size")->excludes("--report-only")->excludes("--dry-run");
  sub->add_flag("--json", *json_out, "print {report, findings, exit_code} as JSON on stdout");
  return {sub, [o, json_out]() -> int {
            for (auto& id : o->only)
              if (!std::set<std::string>{"a", "b", "c", "d"}.count(id))
                fail("--only {}: unknown finding (the findings are a, b, c, d)", id);
            // Under mpirun each rank runs the tasks of its share of the runs (docs/distributed.md); the children
            // are single processes with this rank's CPUs.
            o->rank = dist::rank();
            o->ranks = dist::world_size();
            if (o->ranks > 1) {
              o->cores = dist::default_threads();
              o->barrier = [] { dist::barrier(); };
            }
            o->quiet = false;
            study::ReproduceOutcome r = study::run_reproduce(*o, train_option_kind());
            const auto show = [&](const json& j, void (*as_text)(const json&)) {
              *json_out ? print_json(j) : as_text(j);
              return 0;
            };
            if (o->sample_size) return show(r.sample_size, print_sample_size);
            if (o->dry_run) return show(r.dry_run, print_dry_run);
            if (*json_out)
              print_json({{"report", r.report}, {"findings", r.findings}, {"exit_code", r.exit_code}});
            else if (!r.report.empty())
              fmt::print("report: {}\nfindings: {}\n", r.report, r.findings);
            return r.exit_code;
          }};
}

}  // namespace hlm::cli
