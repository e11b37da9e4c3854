#include "study/verdict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

namespace hlm::study {

using nlohmann::json;

namespace {
// A measurement against a rule's threshold, exact ties decided by the rule rather than by rounding: many
// measurements are exact fractions (onset steps over the run, NIAH hits over samples) whose floating-point mean
// can land an ulp to either side of a threshold (the onset effects -0.1, 4 x 0.2, 0, 0 average to 0.0999..., not
// the 0.1 margin they equal). Within 1e-9 of `scale`, the magnitude of the numbers compared, is a tie.
double tie_width(double scale) { return 1e-9 * scale; }
bool at_least(double x, double threshold, double scale) { return x >= threshold - tie_width(scale); }
bool above(double x, double threshold, double scale) { return x > threshold + tie_width(scale); }
bool below(double x, double threshold, double scale) { return x < threshold - tie_width(scale); }
// The magnitude of a spread's numbers and a threshold, for the tie width.
double scale_of(const Spread& s, double threshold) {
  return std::max({std::fabs(threshold), std::fabs(s.min), std::fabs(s.max)});
}
}  // namespace

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kHolds: return "holds";
    case Verdict::kDoesNotHold: return "does not hold";
    default: return "inconclusive";
  }
}

Spread spread_of(const std::vector<double>& v) {
  Spread s;
  double sum = 0;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -s.min;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    ++s.n;
    sum += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  if (s.n == 0) return Spread{};
  s.mean = sum / s.n;
  double ss = 0;
  for (double x : v)
    if (std::isfinite(x)) ss += (x - s.mean) * (x - s.mean);
  s.sd = s.n > 1 ? std::sqrt(ss / (s.n - 1)) : 0;
  return s;
}

SeedRule SeedRule::from(const json& rule) {
  SeedRule r;
  r.min_seeds = rule.contains("min_seeds") ? rule["min_seeds"].get<int>() : 2;
  r.interval = rule.value("interval", r.interval);
  r.confidence = rule.value("confidence", r.confidence);
  return r;
}

// Exact for whole dof (Abramowitz & Stegun 26.7.3-4): with th = atan(t / sqrt(dof)), A = P(|T| <= |t|) is
// 2/pi (th + sin th (cos th + 2/3 cos^3 th + ...)) for odd dof and sin th (1 + 1/2 cos^2 th + 3/8 cos^4 th + ...)
// for even dof, each series with (dof - 1) / 2 resp. dof / 2 terms.
double student_t_cdf(double t, int dof) {
  if (dof < 1) throw std::invalid_argument("student_t_cdf: dof must be >= 1");
  const double th = std::atan(std::fabs(t) / std::sqrt(static_cast<double>(dof)));
  const double c = std::cos(th), s = std::sin(th), c2 = c * c;
  double a;
  if (dof % 2 == 1) {
    double sum = 0, term = c;
    for (int k = 3; k <= dof; k += 2) {
      sum += term;
      term *= c2 * (k - 1) / k;
    }
    a = 2 / std::numbers::pi * (th + s * sum);
  } else {
    double sum = 0, term = 1;
    for (int k = 2; k <= dof; k += 2) {
      sum += term;
      term *= c2 * (k - 1) / k;
    }
    a = s * sum;
  }
  return t >= 0 ? 0.5 + a / 2 : 0.5 - a / 2;
}

double student_t_quantile(double p, int dof) {
  if (!(p >= 0.5 && p < 1)) throw std::invalid_argument("student_t_quantile: p must be in [0.5, 1)");
  double lo = 0, hi = 1;
  while (student_t_cdf(hi, dof) < p) hi *= 2;  // the cdf is increasing: bracket, then bisect
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = (lo + hi) / 2;
    (student_t_cdf(mid, dof) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

Bounds bounds_of(const Spread& s, const SeedRule& r) {
  return bounds_of(s, r, r.interval == "t" && s.n >= 2 ? student_t_quantile(r.confidence, s.n - 1) : 0);
}

Bounds bounds_of(const Spread& s, const SeedRule& r, double t_quantile) {
  if (r.interval == "t") {
    if (s.n < 2) return {-INFINITY, INFINITY};  // one seed says nothing about the spread
    const double half = t_quantile * s.sd / std::sqrt(static_cast<double>(s.n));
    return {s.mean - half, s.mean + half};
  }
  return {s.mean - s.range(), s.mean + s.range()};
}

Verdict directional_verdict(const Spread& s, const Bounds& b, double margin, const SeedRule& r) {
  if (s.n < r.min_seeds) return Verdict::kInconclusive;
  const double scale = scale_of(s, margin);
  if (at_least(s.mean, margin, scale) && above(b.lo, 0, scale)) return Verdict::kHolds;
  if (below(b.hi, margin, scale)) return Verdict::kDoesNotHold;
  return Verdict::kInconclusive;
}

LimitReading read_limit(const Spread& limited, const Bounds& lb, double limit, const SeedRule& r) {
  const double scale = scale_of(limited, limit);
  if (limited.n >= r.min_seeds && above(lb.lo, limit, scale)) return LimitReading::kBeyond;
  return above(limited.mean, limit, scale) ? LimitReading::kMeanOver : LimitReading::kWithin;
}

Verdict with_limit(Verdict d, LimitReading l) {
  if (l == LimitReading::kBeyond) return Verdict::kDoesNotHold;
  if (d == Verdict::kHolds && l == LimitReading::kMeanOver) return Verdict::kInconclusive;
  return d;
}

namespace {

json spread_json(const Spread& s) {
  if (s.n == 0) return nullptr;
  return {{"mean", s.mean}, {"min", s.min}, {"max", s.max}, {"sd", s.sd}, {"n", s.n}};
}

// "t bounds lo..hi; " where the rule reads t bounds (the range reading shows the seeds' min..max instead).
std::string bounds_text(const Spread& s, const SeedRule& r) {
  if (r.interval != "t" || s.n < 2) return "";
  const Bounds b = bounds_of(s, r);
  return fmt::format("{:g}% t bounds {:+.3g}..{:+.3g}; ", 100 * r.confidence, b.lo, b.hi);
}

}  // namespace

int seeds_to_decide(const Spread& s, double margin, const SeedRule& r) {
  if (r.interval != "t" || s.n < 2 || !(s.sd > 0)) return 0;
  const double scale = scale_of(s, margin);
  const bool toward_holds = at_least(s.mean, margin, scale);
  if (toward_holds && !above(s.mean, 0, scale)) return 0;  // a mean at or below 0 never clears lo > 0
  // The same mean and sd over n seeds: the t bounds narrow as n grows, so "decided with n seeds" is monotone in n.
  const auto decided = [&](int n) {
    Spread more = s;
    more.n = n;
    const Bounds b = bounds_of(more, r);
    return toward_holds ? above(b.lo, 0, scale) : below(b.hi, margin, scale);
  };
  int lo = s.n, hi = kMaxSeedsToDecide;  // not decided with lo seeds; find the first n in (lo, hi] that is
  if (!decided(hi)) return 0;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (decided(mid) ? hi : lo) = mid;
  }
  return hi;
}

VerdictResult directional(const std::vector<double>& effects, double margin, const SeedRule& r) {
  const Spread s = spread_of(effects);
  if (s.n < r.min_seeds)
    return {Verdict::kInconclusive, fmt::format("{} seed{} measured, the rule needs {} to know the seed spread", s.n,
                                                s.n == 1 ? "" : "s", r.min_seeds)};
  const Bounds b = bounds_of(s, r);
  std::string eff = fmt::format("effect {:+.3g} (seeds {:+.3g}..{:+.3g}", s.mean, s.min, s.max);
  if (r.interval == "t")
    eff += fmt::format("; {:g}% t bounds of the mean over {} seeds {:+.3g}..{:+.3g}", 100 * r.confidence, s.n, b.lo,
                       b.hi);
  eff += fmt::format("), margin {:.3g}", margin);
  switch (directional_verdict(s, b, margin, r)) {
    case Verdict::kHolds: return {Verdict::kHolds, eff};
    case Verdict::kDoesNotHold: return {Verdict::kDoesNotHold, eff + ": below the margin beyond the seed spread"};
    default: break;
  }
  std::string why = eff + ": within the seed spread";
  if (const int n = seeds_to_decide(s, margin, r); n > 0)
    why += fmt::format(" (with this mean and spread, {} seeds would read '{}': a figure for planning a new study)", n,
                       at_least(s.mean, margin, scale_of(s, margin)) ? "holds" : "does not hold");
  return {Verdict::kInconclusive, why};
}

VerdictResult verdict_scaling(const ScalingInput& in, const json& rule, json* details) {
  const size_t H = in.hybrids.size();
  size_t S = 0;
  for (auto& v : in.seeds) S = std::max(S, v.size());
  std::vector<double> loss_spread, early, final_, effect;
  json lags = json::array();
  int lag_largest = 0, lag_seeds = 0;
  for (size_t s = 0; s < S; ++s) {
    std::vector<double> loss, e, f;
    bool complete = true;
    for (size_t h = 0; h < H; ++h) {
      const ScalingSeedPoint p = s < in.seeds[h].size() ? in.seeds[h][s] : ScalingSeedPoint{};
      complete &= std::isfinite(p.early_log_longppl) && std::isfinite(p.final_log_longppl) && std::isfinite(p.final_val_loss);
      loss.push_back(p.final_val_loss);
      e.push_back(p.early_log_longppl);
      f.push_back(p.final_log_longppl);
    }
    if (H < 2) continue;
    const Spread ls = spread_of(loss), es = spread_of(e), fs = spread_of(f);
    if (ls.n == static_cast<int>(H)) loss_spread.push_back((ls.max - ls.min) / ls.mean);
    if (!complete) continue;  // a seed counts for LongPPL only with every hybrid measured
    early.push_back(es.max - es.min);
    final_.push_back(fs.max - fs.min);
    effect.push_back(early.back() - final_.back());
    const size_t worst = static_cast<size_t>(std::max_element(e.begin(), e.end()) - e.begin());
    lags.push_back(in.hybrids[worst]);
    ++lag_seeds;
    lag_largest += in.hybrids[worst] == in.largest_window;
  }
  const Spread ls = spread_of(loss_spread);
  if (details) {
    (*details)["loss_spread"] = spread_json(ls);
    (*details)["log_longppl_spread_early"] = spread_json(spread_of(early));
    (*details)["log_longppl_spread_final"] = spread_json(spread_of(final_));
    (*details)["effect"] = spread_json(spread_of(effect));
    (*details)["lags_most_early"] = lags;
    (*details)["largest_window"] = in.largest_window;
    (*details)["largest_window_lags_most"] = fmt::format("{} of {} seeds", lag_largest, lag_seeds);
  }
  if (effect.empty())
    return {Verdict::kInconclusive, "no seed has LongPPL for every hybrid (the evaluator found no key tokens, or "
                                    "runs are missing): the runs did not give the measurement"};
  const double tol = rule.at("loss_spread_max").get<double>();
  const SeedRule sr = SeedRule::from(rule);
  VerdictResult d = directional(effect, rule.at("margin").get<double>(), sr);
  const std::string loss_txt = fmt::format("val-loss spread {:.3g} ({}max {:.3g})", ls.mean, bounds_text(ls, sr), tol);
  const LimitReading l = read_limit(ls, bounds_of(ls, sr), tol, sr);
  if (l == LimitReading::kBeyond)
    return {Verdict::kDoesNotHold, loss_txt + ": the hybrids' val losses differ beyond the seed spread; LongPPL " + d.reason};
  if (with_limit(d.verdict, l) != d.verdict)
    return {Verdict::kInconclusive, "LongPPL spread converges (" + d.reason + ") but " + loss_txt};
  d.reason = "LongPPL spread early - final: " + d.reason + "; " + loss_txt;
  return d;
}

VerdictResult verdict_receptive_field(const ReceptiveInput& in, const json& rule, json* details) {
  const double learned_min = rule.at("learned_min").get<double>(), margin = rule.at("margin").get<double>();
  int holds = 0, not_hold = 0, learned = 0;
  std::string reasons;
  json per = json::object();
  for (size_t h = 0; h < in.hybrids.size(); ++h) {
    std::vector<double> base, full, eff, effect;
    for (auto& s : in.seeds[h]) {
      base.push_back(s.base);
      full.push_back(s.full_capped);
      eff.push_back(s.efficient_capped);
      effect.push_back(s.efficient_capped - s.full_capped);
    }
    const Spread b = spread_of(base);
    VerdictResult r;
    if (b.n == 0) r = {Verdict::kInconclusive, "not measured"};
    else if (below(b.mean, learned_min, scale_of(b, learned_min)))
      r = {Verdict::kInconclusive, fmt::format("did not learn retrieval (NIAH {:.2f} < {:.2f})", b.mean, learned_min)};
    else {
      ++learned;
      r = directional(effect, margin, SeedRule::from(rule));
    }
    holds += r.verdict == Verdict::kHolds;
    not_hold += r.verdict == Verdict::kDoesNotHold;
    reasons += fmt::format("{}{}: {} ({})", reasons.empty() ? "" : "; ", in.hybrids[h], verdict_name(r.verdict), r.reason);
    per[in.hybrids[h]] = {{"verdict", verdict_name(r.verdict)}, {"reason", r.reason},
                          {"niah", spread_json(b)}, {"niah_full_capped", spread_json(spread_of(full))},
                          {"niah_efficient_capped", spread_json(spread_of(eff))},
                          {"effect", spread_json(spread_of(effect))}};
  }
  if (details) (*details)["per_hybrid"] = per;
  if (not_hold > 0) return {Verdict::kDoesNotHold, reasons};
  if (holds == static_cast<int>(in.hybrids.size()) && holds > 0) return {Verdict::kHolds, reasons};
  return {Verdict::kInconclusive, reasons};
}

VerdictResult verdict_laziness(const LazinessInput& in, const json& rule, json* details) {
  const double never = static_cast<double>(in.steps + in.eval_every);
  json per = json::object();
  bool any = false;
  for (size_t h = 0; h < in.hybrids.size(); ++h) {
    std::vector<double> v;
    json seeds = json::array();
    for (double x : in.onset[h]) {
      any |= std::isfinite(x);
      v.push_back(std::isfinite(x) ? x : never);
      seeds.push_back(std::isfinite(x) ? json(x) : json("never"));
    }
    per[in.hybrids[h]] = {{"onset_steps", seeds}, {"mean_counting_never_as", never}, {"mean", spread_of(v).mean}};
  }
  if (details) (*details)["per_hybrid"] = per;
  if (in.hybrids.size() < 2) return {Verdict::kInconclusive, "fewer than two windows compared"};
  if (!any)
    return {Verdict::kInconclusive, fmt::format("no run formed retrieval heads in its full-attention layers within {} "
                                                "steps: the runs did not learn the skill", in.steps)};
  std::vector<double> effect;
  const auto& small = in.onset.front();
  const auto& large = in.onset.back();
  for (size_t s = 0; s < std::min(small.size(), large.size()); ++s) {
    const double a = std::isfinite(small[s]) ? small[s] : never, b = std::isfinite(large[s]) ? large[s] : never;
    effect.push_back((b - a) / static_cast<double>(in.steps));
  }
  VerdictResult r = directional(effect, rule.at("margin_fraction").get<double>(), SeedRule::from(rule));
  r.reason = fmt::format("onset {} - onset {} in fractions of the run: {}", in.hybrids.back(), in.hybrids.front(), r.reason);
  return r;
}

VerdictResult verdict_nope(const std::vector<NopeSeed>& seeds, const json& rule, json* details) {
  std::vector<double> rope, nope, effect, loss_diff;
  for (auto& s : seeds) {
    rope.push_back(s.rope_score);
    nope.push_back(s.nope_score);
    effect.push_back(s.nope_score - s.rope_score);
    loss_diff.push_back(s.nope_loss - s.rope_loss);
  }
  const Spread r = spread_of(rope), n = spread_of(nope), ld = spread_of(loss_diff);
  if (details) {
    (*details)["rope_score"] = spread_json(r);
    (*details)["nope_score"] = spread_json(n);
    (*details)["effect"] = spread_json(spread_of(effect));
    (*details)["loss_difference"] = spread_json(ld);
  }
  const double learned_min = rule.at("learned_min").get<double>(), tol = rule.at("loss_tolerance").get<double>();
  if (r.n == 0 || n.n == 0) return {Verdict::kInconclusive, "not measured"};
  if (below(std::max(r.mean, n.mean), learned_min, std::max(scale_of(r, learned_min), scale_of(n, learned_min))))
    return {Verdict::kInconclusive, fmt::format("neither learned the long-context skill (scores {:.2f} / {:.2f} < {:.2f})",
                                                r.mean, n.mean, learned_min)};
  const SeedRule sr = SeedRule::from(rule);
  VerdictResult d = directional(effect, rule.at("margin").get<double>(), sr);
  const std::string loss_txt =
      fmt::format("short-context loss NoPE - RoPE {:+.3g} ({}tolerance {:.3g})", ld.mean, bounds_text(ld, sr), tol);
  const LimitReading l = read_limit(ld, bounds_of(ld, sr), tol, sr);
  if (l == LimitReading::kBeyond) return {Verdict::kDoesNotHold, loss_txt + " beyond the seed spread; score " + d.reason};
  if (with_limit(d.verdict, l) != d.verdict) return {Verdict::kInconclusive, "score " + d.reason + " but " + loss_txt};
  d.reason = "score NoPE - RoPE: " + d.reason + "; " + loss_txt;
  return d;
}

}  // namespace hlm::study
