// hybridlm sweep PLAN.json: trains every (arch x size x budget) of a plan (study/sweep.h does the work;
// plan format and behaviour: docs/scaling.md).
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include <filesystem>

#include "cli/slurm.h"
#include "core/error.h"
#include "core/file_io.h"
#include "study/child_process.h"
#include "study/sweep.h"
#include "train/distributed.h"

namespace hlm::cli {

namespace fs = std::filesystem;
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
  int jobs = 1, threads = 0;  // trainings at once (per rank under MPI), OpenMP threads each (0: shared evenly)
  std::string emit_slurm;  // write a Slurm array script (cli/slurm.h) instead of training
  SlurmOptions slurm;
};

// --emit-slurm: one array task per run, each resuming its run folder when it has a checkpoint.
int emit_slurm(const study::SweepPlan& p, SlurmOptions so, const std::string& file) {
  if (so.ranks > 1 && p.budget_unit == "tokens")
    fail("{}: --slurm-ranks {} with token budgets would train {}x the tokens (each rank adds its batch); give "
         "train.batch / {} rows per rank in the plan and use --slurm-ranks 1, or budgets in steps",
         p.file, so.ranks, so.ranks, so.ranks);
  std::vector<SlurmRun> runs;
  for (auto& r : p.runs)
    runs.push_back({r.name, r.dir, study::train_command(r, p, false), study::train_command(r, p, true)});
  so.exe = study::self_exe();
  so.log_dir = fs::absolute(p.out).string();
  so.workdir = fs::current_path().string();
  so.job_name = "hlm-" + fs::path(p.file).stem().string();
  const std::string script = slurm_array_script(runs, so);
  fs::create_directories(p.out);
  write_file_atomic(file, script);
  fs::permissions(file, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  fmt::print(stderr, "wrote {}: a Slurm array of {} runs ({} rank(s) each); submit with: sbatch {}\n", file,
             runs.size(), so.ranks, file);
  return 0;
}

int run_sweep_cmd(const SweepOpts& o) {
  study::SweepPlan p = study::load_sweep_plan(o.plan, train_option_kind());
  const int ranks = dist::world_size();
  if (ranks > 1 && (o.dry_run || !o.emit_slurm.empty()))
    fail("sweep --dry-run / --emit-slurm: run it as one process, not under an MPI launcher ({} ranks)", ranks);
  if (!o.emit_slurm.empty()) return emit_slurm(p, o.slurm, o.emit_slurm);
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
  // Threads per training: as given, else this process's CPUs (the ones the launcher bound a rank to) shared
  // by the trainings it runs at once; one training alone keeps train's own default.
  study::SweepShare share{o.jobs, o.threads, dist::rank(), ranks};
  if (share.threads == 0 && (o.jobs > 1 || ranks > 1)) {
    const int cpus = dist::default_threads();  // 0 when OMP_NUM_THREADS decides
    if (cpus > 0) share.threads = std::max(1, cpus / o.jobs);
  }
  study::SweepOutcome out = study::run_sweep(p, o.json, share);
  if (ranks > 1) {
    // Every rank has finished its share (or was interrupted): rank 0 writes the one sweep.json.
    const bool interrupted = dist::any(out.interrupted);
    const bool failed = dist::any(out.failed > 0);
    dist::barrier();
    if (!dist::is_root()) return interrupted ? 130 : failed ? 1 : 0;
    out.runs = study::merge_rank_status(p, ranks);
    out.sweep_json = (fs::path(p.out) / "sweep.json").string();
    out.interrupted = interrupted;
    out.failed = 0;
    for (auto& r : out.runs) out.failed += r["status"] == "failed";
    if (failed && out.failed == 0) out.failed = 1;
  }
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
  sub->add_option("--jobs", o->jobs, "trainings at once (per rank under mpirun, where rank r of N trains runs r, r+N, ...)")
      ->check(in_range(1, 4096))
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "OpenMP threads per training (default: this process's CPUs / --jobs)")
      ->check(in_range(0, 4096));
  sub->add_option("--emit-slurm", o->emit_slurm, "write a Slurm job-array script (one task per run) and exit");
  sub->add_option("--slurm-ranks", o->slurm.ranks, "with --emit-slurm: MPI ranks per run (srun -n)")
      ->capture_default_str();
  sub->add_option("--slurm-threads", o->slurm.threads, "with --emit-slurm: CPUs (OpenMP threads) per rank")
      ->capture_default_str();
  sub->add_option("--slurm-option", o->slurm.sbatch, "with --emit-slurm: an extra #SBATCH option, e.g. time=4:00:00 or partition=cpu")
      ->allow_extra_args(false);
  return {sub, [o]() -> int { return run_sweep_cmd(*o); }};
}

}  // namespace hlm::cli
