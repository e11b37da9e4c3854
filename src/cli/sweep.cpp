// hybridlm sweep PLAN.json: trains every (arch x size x budget) of a plan (study/sweep.h does the work;
// plan format and behaviour: docs/scaling.md).
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "study/sweep.h"

namespace hlm::cli {

using nlohmann::json;

study::TrainOptionKind train_option_kind() {
  auto app = std::make_shared<CLI::App>();
  const Command train_cmd = register_train(*app);
  CLI::App* sub = train_cmd.sub;
  return [app, sub](const std::string& flag) -> int {
    CLI::Option* opt = sub->get_option_no_throw(flag);
    if (!opt) return -1;
    return opt->get_expected_max() == 0 ? 0 : 1;  // add_flag: takes no value
  };
}

namespace {

struct SweepOpts {
  std::string plan;
  bool dry_run = false, json = false;
};

int run_sweep_cmd(const SweepOpts& o) {
  study::SweepPlan p = study::load_sweep_plan(o.plan, train_option_kind());
  if (o.dry_run) {
    json runs = study::sweep_status(p);
    if (o.json) {
      print_json({{"plan", o.plan}, {"out", p.out}, {"dry_run", true}, {"runs", runs},
                  {"summary", study::status_summary(runs)}});
      return 0;
    }
    fmt::print("sweep {}: {} runs into {}\n", o.plan, runs.size(), p.out);
    for (auto& r : runs) {
      std::string what = r["status"] == "done"               ? "done, skip"
                         : r.contains("resume_from_step") ? fmt::format("resume from step {}", r["resume_from_step"].get<long>())
                                                          : "train";
      fmt::print("  {:<32} {:>8} steps {:>12.0f} tokens  {}\n    {}\n", r["name"].get<std::string>(),
                 r["steps"].get<long>(), r["tokens"].get<double>(), what, r["command"].get<std::string>());
    }
    return 0;
  }
  study::SweepOutcome out = study::run_sweep(p, o.json);
  if (o.json) {
    print_json({{"plan", o.plan}, {"out", p.out}, {"sweep_json", out.sweep_json}, {"runs", out.runs},
                {"summary", study::status_summary(out.runs)}});
  } else {
    std::string s;
    const json counts = study::status_summary(out.runs);
    for (auto& [k, v] : counts.items()) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", v.get<int>(), k);
    fmt::print(stderr, "sweep: {} ({}); fit with: hybridlm scaling fit {}\n", s, out.sweep_json, p.out);
  }
  if (out.interrupted) return 130;
  return out.failed ? 1 : 0;
}

}  // namespace

Command register_sweep(CLI::App& app) {
  auto* sub = app.add_subcommand("sweep", "train every (arch x size x budget) of a plan file, resumably");
  auto o = std::make_shared<SweepOpts>();
  sub->add_option("plan", o->plan, "plan JSON file (docs/scaling.md)")->required();
  sub->add_flag("--dry-run", o->dry_run, "list the runs and what would happen; train nothing");
  sub->add_flag("--json", o->json, "print one JSON object (the runs and their status)");
  return {sub, [o]() -> int { return run_sweep_cmd(*o); }};
}

}  // namespace hlm::cli
