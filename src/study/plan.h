#pragma once
// Study plans as data (docs/reproduce.md): the hybrids, the budgets (model size, data, steps, seeds), the
// shared LongPPL evaluator, the miniature proxy (NIAH rows mixed into the text) and, for each finding, its
// metric and the verdict rule's parameters, all written down before anything runs. load_study_plan checks
// everything (unknown fields, presets, window fractions, impossible budgets) and names the file and field.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "study/sweep_plan.h"

namespace hlm::study {

struct HybridSpec {
  std::string name, preset, label;
  std::string window;               // a window class of the plan ("small", "mid", "large"), "" for none
  std::vector<std::string> sets;    // model overrides ("key=value")
};

struct BudgetSpec {
  std::string name, data, tokenizer;
  std::vector<std::string> sets;        // model size overrides for every hybrid
  std::vector<std::string> train_args;  // extra `train` flags (checked against the real subcommand)
  long seq_len = 0, batch = 0, steps = 0, eval_every = 0;
  int seeds = 1;
  int niah_samples = 2;   // needles per (length, depth) cell in the probes and NIAH evals
  int longppl_docs = 4;   // validation documents for LongPPL
  long max_eval_tokens = 16384;  // validation tokens for loss by position (receptive-field probe)
  double tokens_per_step() const { return static_cast<double>(batch * seq_len); }
};

struct FindingSpec {
  std::string id;                    // "a", "b", "c", "d"
  std::string title, claim, metric, rule_text;
  std::vector<std::string> hybrids;  // what it trains (d: [rope, nope])
  nlohmann::json rule;               // the verdict rule's parameters (study/verdict.h)
  nlohmann::json options;            // per-finding measurement options (span, lengths, ruler, ...)
  // Its runs train steps_factor x the budget's steps (a whole number of eval intervals), in run folders of their
  // own: a finding whose skill forms late gets room after it without making every other finding's runs longer.
  double steps_factor = 1;
};

struct StudyPlan {
  std::string file, name, description, window_mapping;
  // What was changed after results had been seen, when and why, in words: the report lists it beside the verdicts.
  std::vector<std::string> amendments;
  std::map<std::string, double> windows;  // class -> fraction of the training length
  std::vector<HybridSpec> hybrids;
  HybridSpec evaluator;                   // the one LongPPL evaluator model (finding a)
  double evaluator_steps_factor = 1;
  double mix_niah = 0;                    // the proxy: fraction of training rows that are NIAH rows
  std::string mix_haystack = "noise", proxy_note;
  int niah_digits = 2;
  std::map<std::string, BudgetSpec> budgets;
  std::vector<FindingSpec> findings;      // in order a, b, c, d

  const HybridSpec& hybrid(const std::string& name) const;
  const FindingSpec* finding(const std::string& id) const;  // nullptr when the plan has none
  // The window (tokens) of a hybrid at a budget: round(fraction * seq_len), at least 1; 0 when none.
  long window_tokens(const HybridSpec& h, const BudgetSpec& b) const;
};

// factor x the budget's steps, rounded to a whole number of eval intervals (at least one): the training length of
// the evaluator and of a finding with a steps_factor.
long scaled_steps(const BudgetSpec& b, double factor);

// Reads and checks a plan. `train_option` checks the budgets' train flags against `hybridlm train`.
// hlm::Error "<file>: field '<path>' ..." on anything malformed, unknown or impossible.
StudyPlan load_study_plan(const std::string& file, const TrainOptionKind& train_option);

// The plan shipped with the project (studies/paper.json in the source tree).
std::string default_plan_path();

}  // namespace hlm::study
