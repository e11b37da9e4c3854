#pragma once
// Verdict rules, as pure functions of per-seed measurements (docs/reproduce.md "Verdict rules"). Each
// finding gives one of: holds, does not hold, inconclusive (the effect is within the seed spread, too few
// seeds to know the spread, or the runs did not learn the skill the finding is about). The parameters come
// from the plan, written before anything ran.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hlm::study {

enum class Verdict { kHolds, kDoesNotHold, kInconclusive };
std::string verdict_name(Verdict v);  // "holds", "does not hold", "inconclusive"

struct VerdictResult {
  Verdict verdict = Verdict::kInconclusive;
  std::string reason;
};

struct Spread {
  int n = 0;
  double mean = 0, min = 0, max = 0;
  double range() const { return n > 1 ? max - min : 0; }
};
// Over the finite values (NaN = missing); n = how many were finite.
Spread spread_of(const std::vector<double>& v);

// The directional rule every finding uses: `effects` are per-seed effects signed so that positive is what the
// paper claims, `margin` the smallest effect that counts as the claim.
//   fewer than min_seeds finite effects            -> inconclusive (no seed spread to judge by)
//   mean >= margin, every seed > 0, mean > range   -> holds
//   mean + range < margin                          -> does not hold (every plausible effect is below the margin)
//   otherwise                                      -> inconclusive (effect within the seed spread)
VerdictResult directional(const std::vector<double>& effects, double margin, int min_seeds);

// a. Scaling. Per hybrid, per seed: log LongPPL at the first and at the last checkpoint, final val loss.
struct ScalingSeedPoint {
  double early_log_longppl = NAN, final_log_longppl = NAN, final_val_loss = NAN;
};
struct ScalingInput {
  std::vector<std::string> hybrids;                     // the largest SWA window named by `largest_window`
  std::vector<std::vector<ScalingSeedPoint>> seeds;     // [hybrid][seed]
  std::string largest_window;                           // hybrid name ("" when none)
};
// Per seed: loss spread = (max - min) / mean of the final val losses across hybrids; LongPPL spread early /
// final = max - min of log LongPPL across hybrids. effect = early spread - final spread (it converges).
// holds: directional(effect, margin) holds and the mean loss spread <= loss_spread_max; does not hold: the
// directional rule says so, or the loss spread is above loss_spread_max by more than its range.
// Details (spreads, which hybrid lags most early) go to `details`.
VerdictResult verdict_scaling(const ScalingInput& in, const nlohmann::json& rule, nlohmann::json* details);

// b. Receptive field. Per hybrid, per seed: NIAH unrestricted, with the full layers capped, with the
// efficient layers capped. A hybrid whose unrestricted NIAH mean is below learned_min did not learn
// retrieval (inconclusive). effect = NIAH(efficient capped) - NIAH(full capped). The finding holds when it
// holds for every hybrid, does not hold when it does not for any learned hybrid, else inconclusive.
struct ReceptiveSeed {
  double base = NAN, full_capped = NAN, efficient_capped = NAN;
};
struct ReceptiveInput {
  std::vector<std::string> hybrids;
  std::vector<std::vector<ReceptiveSeed>> seeds;  // [hybrid][seed]
};
VerdictResult verdict_receptive_field(const ReceptiveInput& in, const nlohmann::json& rule, nlohmann::json* details);

// c. Large-window laziness. Hybrids ordered from the smallest window to the largest; per seed the step at
// which the full-attention layers first have >= heads_min retrieval heads (NaN: never within the run,
// counted as steps + eval_every). No run forming such heads = did not learn (inconclusive).
// effect = (onset largest - onset smallest) / steps.
struct LazinessInput {
  std::vector<std::string> hybrids;          // small -> large window
  std::vector<std::vector<double>> onset;    // [hybrid][seed], steps; NaN = never
  long steps = 0, eval_every = 0;
};
VerdictResult verdict_laziness(const LazinessInput& in, const nlohmann::json& rule, nlohmann::json* details);

// d. NoPE on the full layers. Per seed: long-context score (NIAH / RULER averaged over the lengths, 0..1)
// and short-context val loss of the RoPE and the NoPE hybrid. Neither reaching learned_min = did not learn.
// effect = score(NoPE) - score(RoPE); holds when directional holds and the loss difference (NoPE - RoPE)
// is at most loss_tolerance; does not hold when directional says so, or NoPE's loss is worse than the
// tolerance by more than its range.
struct NopeSeed {
  double rope_score = NAN, nope_score = NAN, rope_loss = NAN, nope_loss = NAN;
};
VerdictResult verdict_nope(const std::vector<NopeSeed>& seeds, const nlohmann::json& rule, nlohmann::json* details);

}  // namespace hlm::study
