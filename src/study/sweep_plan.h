#pragma once
// A sweep's plan file, read and checked (`hybridlm sweep PLAN`; format in docs/scaling.md): every
// (arch x size x budget) as a planned run with its model and train flags. Running the plan is study/sweep.h;
// reading it lives apart so that it builds with the other readers of untrusted files (the sanitized reader build,
// docs/reliability.md).
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hlm::study {

// How `hybridlm train` takes an option: -1 it has no such option, 0 a switch (no value), 1 one value.
// Given by the CLI (study/ does not know the CLI), so a plan's train flags are checked against the real
// subcommand.
using TrainOptionKind = std::function<int(const std::string& long_flag)>;

struct PlannedRun {
  std::string name, arch, size;
  long budget = 0;        // as written in the plan (steps or tokens)
  long steps = 0;         // optimizer steps to train
  double tokens = 0;      // steps * tokens per step
  std::vector<std::string> model_args, train_args;  // flags for `train` (model: only on a fresh start)
  nlohmann::json model_config;  // the resolved config (to check an existing run folder against)
  std::string dir;
};

struct SweepPlan {
  std::string file, out, data = "default", tokenizer, budget_unit = "steps";
  double tokens_per_step = 0;
  std::vector<PlannedRun> runs;
};

// Reads and checks a plan; hlm::Error naming the file and field on any problem, before anything runs.
SweepPlan load_sweep_plan(const std::string& file, const TrainOptionKind& train_option);

}  // namespace hlm::study
