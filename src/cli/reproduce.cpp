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
  sub->add_option("--jobs", o->jobs, "child processes at once (default: one per core; each gets cores/jobs threads)");
  add_precision_flag(sub, &o->precision);
  sub->add_option("--out", o->out, "study folder: runs/, findings.json, report.md, figures")->required();
  sub->add_flag("--report-only", o->report_only, "rewrite report.md and the figures from DIR/findings.json alone");
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
            if (*json_out)
              print_json({{"report", r.report}, {"findings", r.findings}, {"exit_code", r.exit_code}});
            else if (!r.report.empty())
              fmt::print("report: {}\nfindings: {}\n", r.report, r.findings);
            return r.exit_code;
          }};
}

}  // namespace hlm::cli
