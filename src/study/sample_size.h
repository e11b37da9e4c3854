#pragma once
// How many fresh seeds would decide a finding (`hybridlm reproduce --out DIR --sample-size`; docs/reproduce.md
// "Sizing a fresh sample"). A finding's per-seed measurements are modelled as normal with a pilot's mean and
// standard deviation (one study folder's findings.json, or several pooled), and the plan's own rule
// (study/verdict.h) is applied to simulated samples of n seeds: how often would a new sample read holds, does not
// hold, inconclusive? A planning figure for a confirmatory sample declared before it runs, not a result: the draws
// are seeded, so the same findings give the same figures on every machine.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "study/verdict.h"

namespace hlm::study {

// What a finding's rule reads per seed: the effect against `margin` and, for a and d, a second measurement
// bounded from above by `limit` (has_limit).
struct SampleModel {
  Spread effect;
  double margin = 0;
  SeedRule rule;
  bool has_limit = false;
  Spread limited;
  double limit = 0;
};

struct SampleOdds {
  int seeds = 0;
  double holds = 0, does_not_hold = 0, inconclusive = 0;  // fractions of the simulated samples
};

// `draws` samples of n seeds, each seed's effect (and limited measurement) drawn from a normal with the model's
// mean and sd; `seed` picks the draws.
SampleOdds sample_odds(const SampleModel& m, int n, int draws, uint64_t seed);

// The draws' seed for n seeds in sample_size() and seeds_for_decision(): each n has its own, so a figure does not
// depend on which other seed counts were computed.
uint64_t sample_seed(int n);

// The fewest seeds (2..max_seeds) with which at least `decided` of the samples read holds or does not hold, or 0.
int seeds_for_decision(const SampleModel& m, double decided, int draws, int max_seeds = 200);

// Spreads of separate samples as one: n, mean and sd exactly as spread_of over all their values; min, max overall
// (sd NaN when a part with two or more values has none).
Spread pooled(const std::vector<Spread>& parts);

// Per finding of `main` (a findings.json), its model pooled with the same finding in `pilots` (other folders'
// findings.json; a finding missing there is skipped), the rule from `main`, and its odds at a grid of seed
// counts: {draws, findings: [{id, title, model, sources: [{path, effect}], odds: [...], decided,
// seeds_for_decided, note}]}, seeds_for_decided being the fewest seeds deciding 80% of the samples (0: none up
// to 200, or the range reading). Finding b has no figure: its per-seed effects are all or nothing (a run
// learns retrieval or not). `paths` names main then each pilot, for the sources.
nlohmann::json sample_size(const nlohmann::json& main, const std::vector<nlohmann::json>& pilots,
                           const std::vector<std::string>& paths, int draws = 20000);

}  // namespace hlm::study
