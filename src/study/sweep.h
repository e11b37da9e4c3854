#pragma once
// Sweeps: every (arch x size x budget) of a plan file trained as a child `hybridlm train` process,
// resumably (finished runs are skipped, interrupted ones continue with --resume), with <out>/sweep.json
// keeping each run's status so that `hybridlm scaling fit <out>` can fit the result. Plan format and
// behaviour: docs/scaling.md.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "study/sweep_plan.h"

namespace hlm::study {

// What a run folder holds: nothing yet, or the step of its newest checkpoint. hlm::Error when the folder
// holds another model than the plan's, or a checkpoint past the planned steps.
struct RunOnDisk {
  bool exists = false, has_ckpt = false;
  long step = 0;
  bool finished(long steps) const { return has_ckpt && step == steps; }  // trained to the planned steps
};
RunOnDisk inspect_run(const PlannedRun& r);

// Before (re)starting a run: waits for a trainer still saving into the folder (one of a killed study) to let go
// of its lock, creates the folder; a run started but never checkpointed starts over, its old metrics rows set
// aside (metrics.jsonl.stale-<time>) so they are not mixed in.
void prepare_run_folder(const PlannedRun& r);

// The `hybridlm train ...` arguments (without the program name) that start or resume a run.
std::vector<std::string> train_command(const PlannedRun& r, const SweepPlan& p, bool resume);

// One entry per run with its status (done / pending, resume_from_step) and command, as in sweep.json.
nlohmann::json sweep_status(const SweepPlan& p);
// {"done": n, "pending": m, ...} of a runs array.
nlohmann::json status_summary(const nlohmann::json& runs);

// How a sweep process shares the plan's runs: `jobs` trainings at once, each with `threads` OpenMP threads
// (0: train's own default), and under an MPI launcher rank `rank` of `ranks` takes the runs whose index i
// has i % ranks == rank (each training a single process of its own).
struct SweepShare {
  int jobs = 1, threads = 0, rank = 0, ranks = 1;
};

// Trains this process's share of what is not done, keeping its status file up to date (<out>/sweep.json;
// with ranks > 1 <out>/sweep.rank-R.json, holding this rank's runs only, until merge_rank_status). Progress
// lines on stderr unless quiet. Ctrl-C is forwarded to the trainings, which save; nothing new starts.
struct SweepOutcome {
  nlohmann::json runs;  // as in sweep.json (this process's runs)
  std::string sweep_json;
  bool interrupted = false;
  int failed = 0;
};
SweepOutcome run_sweep(const SweepPlan& p, bool quiet, const SweepShare& share = {});

// After every rank's run_sweep (one process calls it): <out>/sweep.json from the ranks' status files, which
// are then removed; returns the merged runs.
nlohmann::json merge_rank_status(const SweepPlan& p, int ranks);

}  // namespace hlm::study
