#pragma once
// A study's work as a graph of child `hybridlm` commands (trainings, evaluations, probes): up to `jobs` run
// at once, a task starts when the tasks it depends on are done, a task already done on disk is skipped (so
// a rerun continues where the last one stopped), and a progress line says tasks done / total, runs trained
// and the ETA. Ctrl-C is forwarded to the running children (trainings save); nothing new starts after it.
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
};

struct GraphOutcome {
  int done = 0, failed = 0, skipped = 0;            // skipped: a dependency failed
  bool interrupted = false;
  std::vector<std::string> errors;                  // "label: what went wrong (log ...)"
  double seconds = 0;
};

// Runs the graph; `exe` is the hybridlm binary. Progress on stderr unless quiet.
GraphOutcome run_task_graph(const std::string& exe, std::vector<Task>& tasks, int jobs, bool quiet);

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

}  // namespace hlm::study
