#pragma once
// `hybridlm reproduce`: a study plan at one budget, end to end (docs/reproduce.md). Plans the runs the
// chosen findings need (hybrids x seeds, plus the shared LongPPL evaluator), trains them as child
// `hybridlm train` processes, runs the evaluations and probes on them as child `hybridlm eval/probe`
// processes (their JSON kept in each run's evals/ folder), then reads everything back, applies the plan's
// verdict rules and writes DIR/findings.json, DIR/report.md and the SVG figures. Rerunning continues: what
// is on disk is not redone.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "study/sweep.h"

namespace hlm::study {

struct ReproduceOptions {
  std::string plan;                 // plan file (default: studies/paper.json)
  std::string budget = "tiny";
  std::string out;
  std::vector<std::string> only;    // finding ids; empty = every finding of the plan
  int seeds = 0;                    // 0: the budget's
  int first_seed = 0;               // seeds first_seed.. (a fresh sample); 0: the folder's, else 1
  int jobs = 0;                     // children at once; 0: one per core
  std::string precision = "fp32";   // every training's --precision (bf16 needs a CPU with native bf16)
  bool report_only = false;         // rewrite report.md + figures from DIR/findings.json alone
  bool sample_size = false;         // how many fresh seeds would decide each finding (study/sample_size.h); no run
  std::vector<std::string> pilots;  // with sample_size: other study folders whose seeds are pooled with DIR's
  bool dry_run = false;             // plan only: ReproduceOutcome::dry_run lists the runs and tasks; nothing runs
  bool measure = false;             // with dry_run: time each model's training here (a short `hybridlm bench`)
  bool quiet = false;
  // Across MPI ranks sharing DIR (cli/reproduce.cpp fills these under mpirun): rank r runs the tasks of the
  // runs r, r+R, ... (trainings, their evaluations and probes) and learns of the others' from DIR; rank 0
  // writes the report. cores: CPUs this process may use (0: the machine's). barrier: waits for every rank.
  int rank = 0, ranks = 1, cores = 0;
  std::function<void()> barrier;
};

struct ReproduceOutcome {
  int exit_code = 0;                // 0 done, 1 a task failed, 130 interrupted
  std::string report, findings;     // paths written ("" when interrupted before the report)
  // --dry-run: plan, budget, data (LongPPL's documents, training tokens), each run (preset, window, steps, tokens,
  // parameters, training FLOPs, passes over the training text, on disk: new / step N / done), tasks by kind.
  nlohmann::json dry_run;
  nlohmann::json sample_size;       // --sample-size: study::sample_size() of DIR and the pilots
};

ReproduceOutcome run_reproduce(const ReproduceOptions& o, const TrainOptionKind& train_option);

}  // namespace hlm::study
