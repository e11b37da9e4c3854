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
  double mean = 0, min = 0, max = 0, sd = 0;  // sd: sample standard deviation (0 for one value)
  double range() const { return n > 1 ? max - min : 0; }
};
// Over the finite values (NaN = missing); n = how many were finite.
Spread spread_of(const std::vector<double>& v);

// How a rule reads the seed spread (the rule's optional `interval` and `confidence`; docs/reproduce.md):
//   "range" (the default): the plausible mean lies in mean -/+ (max - min). Strict with few seeds, and it never
//            gets easier with more: the range only grows as seeds are added.
//   "t":     one-sided Student-t bounds at `confidence` (default 0.95): mean -/+ t(confidence, n-1) sd / sqrt(n),
//            which narrow as seeds are added (about as strict as "range" at 3 seeds, less from 4 on).
struct SeedRule {
  int min_seeds = 2;
  std::string interval = "range";
  double confidence = 0.95;
  static SeedRule from(const nlohmann::json& rule);  // the plan's rule object (missing fields: the defaults)
};
struct Bounds {
  double lo = 0, hi = 0;
};
Bounds bounds_of(const Spread& s, const SeedRule& r);
// The same with t(confidence, n - 1) already known (it costs a bisection; a simulation reuses it across samples).
Bounds bounds_of(const Spread& s, const SeedRule& r, double t_quantile);
// Student t distribution with `dof` degrees of freedom: P(T <= t), and the t with P(T <= t) = p (0.5 <= p < 1).
double student_t_cdf(double t, int dof);
double student_t_quantile(double p, int dof);

// The directional rule every finding uses: `effects` are per-seed effects signed so that positive is what the
// paper claims, `margin` the smallest effect that counts as the claim, [lo, hi] the bounds of the mean above.
//   fewer than min_seeds finite effects   -> inconclusive (no seed spread to judge by)
//   mean >= margin and lo > 0             -> holds ("range": mean > range, which implies every seed > 0)
//   hi < margin                           -> does not hold (every plausible effect is below the margin)
//   otherwise                             -> inconclusive (effect within the seed spread)
VerdictResult directional(const std::vector<double>& effects, double margin, const SeedRule& r);
inline VerdictResult directional(const std::vector<double>& effects, double margin, int min_seeds) {
  return directional(effects, margin, SeedRule{min_seeds});
}
// The rule alone, on a spread and its bounds (directional() adds the reason; study/sample_size.h simulates it).
Verdict directional_verdict(const Spread& s, const Bounds& b, double margin, const SeedRule& r);

// Findings a and d also bound a second per-seed measurement from above (a: the val-loss spread, d: NoPE's loss
// difference). kBeyond: its lower bound is above the limit (the finding does not hold, whatever the effect says);
// kMeanOver: its mean is (a finding that would hold is inconclusive); kWithin: the effect's verdict stands.
enum class LimitReading { kWithin, kMeanOver, kBeyond };
LimitReading read_limit(const Spread& limited, const Bounds& lb, double limit, const SeedRule& r);
Verdict with_limit(Verdict effect_verdict, LimitReading l);
// For an inconclusive reading with "t" bounds: the fewest seeds with which the same mean and standard deviation
// would decide the rule (mean >= margin: lo > 0, "holds"; else hi < margin, "does not hold"), or 0 (the "range"
// reading, no spread, a mean that cannot clear 0, or more than kMaxSeedsToDecide). The inconclusive reason quotes
// it as a planning figure for a new study: adding seeds to a study until it is decided makes a decision likelier
// than the rule's confidence says.
inline constexpr int kMaxSeedsToDecide = 1000;
int seeds_to_decide(const Spread& s, double margin, const SeedRule& r);

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
// directional rule says so, or the loss spread's lower bound is above loss_spread_max.
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
// is at most loss_tolerance; does not hold when directional says so, or the lower bound of NoPE's loss
// difference is above the tolerance.
struct NopeSeed {
  double rope_score = NAN, nope_score = NAN, rope_loss = NAN, nope_loss = NAN;
};
VerdictResult verdict_nope(const std::vector<NopeSeed>& seeds, const nlohmann::json& rule, nlohmann::json* details);

}  // namespace hlm::study
