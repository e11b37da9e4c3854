#pragma once
// A study's work as a graph of child `hybridlm` commands (trainings, evaluations, probes): up to `jobs` run
// at once, a task starts when the tasks it depends on are done, a task already done on disk is skipped (so
// a rerun continues where the last one stopped), and a progress line says tasks done / total, runs trained
// and the ETA. Ctrl-C is forwarded to the running children (trainings save); nothing new starts after it.
// Across processes (MPI ranks sharing the study folder), each process runs the tasks it owns and learns of the
// others' from the folder: a task is done when its `done` says so, failed when its owner left a marker file.
#include <functional>
#include <string>
#include <vector>

namespace hlm::study {

struct Task {
  std::string label;                                // e.g. "train swa-small-s1"
  std::function<bool()> done;                       // already complete on disk
  std::function<std::vector<std::string>()> args;   // the `hybridlm` arguments, made when the task starts
  std::function<void()> before;                     // optional: prepare the folder before the start
  std::function<std::string()> check;               // optional, after exit 0: "" when complete, else what is wrong
  std::string log;                                  // stderr (and stdout when no output) appended here
  std::string output;                               // stdout is the result: written to output.tmp, renamed on success
  std::vector<size_t> deps;                         // indices of tasks that must be done first
  double weight = 1;                                // relative cost, for the ETA
  bool is_run = false;                              // a training (counted as "runs trained")
  std::string group;                                // the run it belongs to; "" = study-wide (rank 0's)
};

// Which tasks this process runs: the groups in order of first appearance go to ranks 0, 1, ..., R-1, 0, ...;
// study-wide tasks to rank 0. Others are waited for through `markers` (a folder on the shared filesystem).
struct GraphShare {
  int rank = 0, ranks = 1;
  std::string markers;
};

struct GraphOutcome {
  int done = 0, failed = 0, skipped = 0;            // skipped: a dependency failed
  int done_before = 0;                               // of `done`: those done before this sitting began
  bool interrupted = false;
  std::vector<std::string> errors;                  // "label: what went wrong (log ...)"
  double seconds = 0;
};

// Runs the graph; `exe` is the hybridlm binary. Progress on stderr unless quiet.
GraphOutcome run_task_graph(const std::string& exe, std::vector<Task>& tasks, int jobs, bool quiet,
                            const GraphShare& share = {});

// Seconds until the tasks not done are done, for the progress line: 0 when none is left, else < 0 (unknown) until a
// task has finished in this sitting.
// Each of `slots` children is taken to work at the rate the tasks finished in this sitting showed (their weight over
// their own run time, not over the wall time, which would count the children still running as idle and double the
// first ETAs of a 2-job study); a running task is credited with what that rate did in the time it has run (at most
// its weight). `remaining_weight` counts the running tasks whole; `running` holds their (weight, seconds so far).
double eta_seconds(double remaining_weight, double finished_weight, double finished_seconds,
                   const std::vector<std::pair<double, double>>& running, int slots);

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

}  // namespace hlm::study
