#pragma once
// The scaling-fit policy over run folders (docs/scaling.md): which runs count (a sweep's unfinished runs
// do not), how they are grouped (by architecture, preset or run), which evaluation points enter L(C)
// (frontier, final, all), when a law is fitted at all (3 distinct compute values for L(C), 5 distinct
// (N, D) for Chinchilla) and how the bootstrap resamples (runs when a group has >= 3, else points).
// `hybridlm scaling fit` and `hybridlm reproduce` both call it.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/plot.h"

namespace hlm::study {

struct FitPolicy {
  std::string metric = "val_loss", group_by = "pattern", points = "frontier", params = "matmul", grid = "full";
  int bootstrap = 100;
  std::uint64_t seed = 0;
};
// hlm::Error naming the flag (--group-by, --points, --params, --grid, --bootstrap) when a choice is unknown.
void check_fit_policy(const FitPolicy& p);

// A run folder with what its sweep (if any) says about it.
struct RunRef {
  std::string dir;
  std::string sweep_arch;    // the plan's arch name when the run belongs to a sweep
  std::string sweep_status;  // "" when not part of a sweep
};
// Arguments -> run folders: a run folder; a sweep.json or a sweep folder (its runs); a folder of runs.
std::vector<RunRef> expand_runs(const std::vector<std::string>& args);

struct FitResult {
  nlohmann::json groups = nlohmann::json::array();        // per group: runs, points, power_law, chinchilla
  nlohmann::json skipped_runs = nlohmann::json::array();  // {dir, reason}
  std::string text;                                       // the human-readable summary, one block per group
  std::vector<Series> points, fits;                       // for a log-log plot: measured points, fitted curves
};
// Groups the runs, fits L(C) (and Chinchilla where possible) per group. `quiet`: no notes on stderr.
// hlm::Error when no run is left to fit.
FitResult fit_runs(const std::vector<RunRef>& runs, const FitPolicy& p, bool quiet);

}  // namespace hlm::study
