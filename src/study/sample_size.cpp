#include "study/sample_size.h"

#include <cmath>
#include <numbers>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "core/error.h"

namespace hlm::study {

using nlohmann::json;

namespace {

// Normal draws from a fixed generator: mt19937_64's sequence is the same everywhere, and Box-Muller on its bits
// (unlike std::normal_distribution, whose algorithm each standard library picks) keeps the figures portable.
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  double operator()(double mean, double sd) {
    if (has_spare_) {
      has_spare_ = false;
      return mean + sd * spare_;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2 * std::log(u1)), th = 2 * std::numbers::pi * u2;
    spare_ = r * std::sin(th);
    has_spare_ = true;
    return mean + sd * r * std::cos(th);
  }

 private:
  double uniform() { return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1p-53; }  // in (0, 1)
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

Spread spread_from_json(const json& j) {
  Spread s;
  if (!j.is_object()) return s;
  s.n = j.value("n", 0);
  s.mean = j.value("mean", 0.0);
  s.sd = j.value("sd", NAN);  // findings.json files from before 2026-12-04 keep min and max only
  s.min = j.value("min", s.mean);
  s.max = j.value("max", s.mean);
  return s;
}

// One folder's per-seed measurements of a finding, as its rule reads them.
struct Measured {
  Spread effect, limited;
};

// `budget_steps`: the study's steps, for findings.json files older than the per-finding `steps` field.
std::optional<Measured> measured(const json& f, long budget_steps) {
  const std::string id = f.value("id", "");
  const json& d = f.value("details", json::object());
  if (id == "a") return Measured{spread_from_json(d.value("effect", json())), spread_from_json(d.value("loss_spread", json()))};
  if (id == "d")
    return Measured{spread_from_json(d.value("effect", json())), spread_from_json(d.value("loss_difference", json()))};
  if (id == "c") {  // onset(largest window) - onset(smallest), in fractions of the run, "never" as the rule counts it
    const auto& hy = f.at("hybrids");
    const json& per = d.value("per_hybrid", json::object());
    if (hy.size() < 2 || !per.contains(hy.front()) || !per.contains(hy.back())) return Measured{};
    const json &small = per[hy.front()], &large = per[hy.back()];
    const double never = small.at("mean_counting_never_as").get<double>(),
                 steps = f.contains("steps") ? f["steps"].get<double>() : static_cast<double>(budget_steps);
    const auto step = [&](const json& x) { return x.is_number() ? x.get<double>() : never; };
    std::vector<double> effect;
    for (size_t s = 0; s < std::min(small["onset_steps"].size(), large["onset_steps"].size()); ++s)
      effect.push_back((step(large["onset_steps"][s]) - step(small["onset_steps"][s])) / steps);
    return Measured{spread_of(effect), Spread{}};
  }
  return std::nullopt;  // b: all or nothing per seed, no normal model
}

// The rule's margin and, for a and d, the upper limit of the second measurement, from the finding's rule.
SampleModel model_of(const std::string& id, const json& rule) {
  SampleModel m;
  m.rule = SeedRule::from(rule);
  if (id == "a") {
    m.margin = rule.at("margin").get<double>();
    m.has_limit = true;
    m.limit = rule.at("loss_spread_max").get<double>();
  } else if (id == "c") {
    m.margin = rule.at("margin_fraction").get<double>();
  } else {
    m.margin = rule.at("margin").get<double>();
    m.has_limit = true;
    m.limit = rule.at("loss_tolerance").get<double>();
  }
  return m;
}

json odds_json(const SampleOdds& o) {
  return {{"seeds", o.seeds}, {"holds", o.holds}, {"does_not_hold", o.does_not_hold}, {"inconclusive", o.inconclusive}};
}

json spread_summary(const Spread& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"sd", std::isnan(s.sd) ? json() : json(s.sd)}};  // null: not recorded
}

constexpr double kDecided = 0.8;  // the power a confirmatory sample is usually sized for
const int kGrid[] = {3, 4, 5, 6, 7, 8, 10, 12, 15, 20, 30, 50};

}  // namespace

uint64_t sample_seed(int n) { return 1000003ULL * static_cast<uint64_t>(n); }

SampleOdds sample_odds(const SampleModel& m, int n, int draws, uint64_t seed) {
  if (n < 1 || draws < 1) fail("sample_odds: n and draws must be >= 1 (got {} and {})", n, draws);
  const double t = m.rule.interval == "t" && n >= 2 ? student_t_quantile(m.rule.confidence, n - 1) : 0;
  Normal normal(seed);
  std::vector<double> effect(n), limited(n);
  SampleOdds o;
  o.seeds = n;
  for (int i = 0; i < draws; ++i) {
    for (auto& x : effect) x = normal(m.effect.mean, m.effect.sd);
    const Spread e = spread_of(effect);
    Verdict v = directional_verdict(e, bounds_of(e, m.rule, t), m.margin, m.rule);
    if (m.has_limit) {
      for (auto& x : limited) x = normal(m.limited.mean, m.limited.sd);
      const Spread l = spread_of(limited);
      v = with_limit(v, read_limit(l, bounds_of(l, m.rule, t), m.limit, m.rule));
    }
    (v == Verdict::kHolds ? o.holds : v == Verdict::kDoesNotHold ? o.does_not_hold : o.inconclusive) += 1;
  }
  o.holds /= draws;
  o.does_not_hold /= draws;
  o.inconclusive /= draws;
  return o;
}

int seeds_for_decision(const SampleModel& m, double decided, int draws, int max_seeds) {
  // Only the t reading narrows as seeds are added (the range one widens), so only there is "enough seeds" a
  // threshold to search for; each n has its own draws, so the answer does not depend on the search's path.
  if (m.rule.interval != "t") return 0;
  const auto ok = [&](int n) {
    const SampleOdds o = sample_odds(m, n, draws, sample_seed(n));
    return o.holds + o.does_not_hold >= decided;
  };
  int lo = 1, hi = max_seeds;  // one seed decides nothing (no spread)
  if (!ok(hi)) return 0;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (ok(mid) ? hi : lo) = mid;
  }
  return hi;
}

Spread pooled(const std::vector<Spread>& parts) {
  Spread p;
  double sum = 0;
  for (auto& s : parts)
    if (s.n > 0) {
      p.min = p.n == 0 ? s.min : std::min(p.min, s.min);
      p.max = p.n == 0 ? s.max : std::max(p.max, s.max);
      p.n += s.n;
      sum += s.n * s.mean;
    }
  if (p.n == 0) return Spread{};
  p.mean = sum / p.n;
  double ss = 0;  // within each part, plus each part's mean against the pooled one
  for (auto& s : parts)
    if (s.n > 0) ss += (s.n > 1 ? (s.n - 1) * s.sd * s.sd : 0) + s.n * (s.mean - p.mean) * (s.mean - p.mean);
  p.sd = p.n > 1 ? std::sqrt(ss / (p.n - 1)) : 0;
  return p;
}

json sample_size(const json& main, const std::vector<json>& pilots, const std::vector<std::string>& paths, int draws) {
  json out = json::array();
  for (auto& f : main.at("findings")) {
    const std::string id = f.value("id", "");
    json r = {{"id", id}, {"title", f.value("title", id)}};
    std::optional<Measured> here;
    SampleModel m;
    try {
      here = measured(f, main.at("budget").at("steps").get<long>());
      if (here) m = model_of(id, f.at("rule"));
    } catch (const json::exception& e) {
      fail("{}: finding {}: {}", paths.at(0), id, e.what());
    }
    if (!here) {
      r["note"] = "no figure: the rule reads each hybrid's NIAH with and without caps, and a run either learns "
                  "retrieval or does not, so its per-seed effects are all or nothing, which a normal model does not "
                  "describe";
      out.push_back(r);
      continue;
    }
    std::vector<Spread> effects{here->effect}, limits{here->limited};
    json sources = json::array({{{"path", paths.at(0)}, {"effect", spread_summary(here->effect)}}});
    std::string note;
    for (size_t p = 0; p < pilots.size(); ++p)
      for (auto& g : pilots[p].at("findings")) {
        if (g.value("id", "") != id) continue;
        std::optional<Measured> m;
        try {
          m = measured(g, pilots[p].at("budget").at("steps").get<long>());
        } catch (const json::exception& e) {
          fail("{}: finding {}: {}", paths.at(p + 1), id, e.what());
        }
        if (!m) continue;
        effects.push_back(m->effect);
        limits.push_back(m->limited);
        sources.push_back({{"path", paths.at(p + 1)}, {"effect", spread_summary(m->effect)}});
        if (g.value("rule", json()) != f.value("rule", json()))
          note += fmt::format("{}'s rule differs from {}'s; the figures use {}'s. ", paths.at(p + 1), paths.at(0),
                              paths.at(0));
      }
    m.effect = pooled(effects);
    m.limited = pooled(limits);
    r["sources"] = sources;
    r["model"] = {{"effect", spread_summary(m.effect)}, {"margin", m.margin}, {"interval", m.rule.interval},
                  {"confidence", m.rule.confidence}, {"min_seeds", m.rule.min_seeds}};
    if (m.has_limit) {
      r["model"]["limited_name"] = id == "a" ? "val-loss spread across the hybrids" : "short-context loss NoPE - RoPE";
      r["model"]["limited"] = spread_summary(m.limited);
      r["model"]["limit"] = m.limit;
      if (m.limited.n < 2) note += "the limited measurement has fewer than 2 seeds: it is left out. ";
      m.has_limit = m.limited.n >= 2;
    }
    if (m.has_limit && std::isnan(m.limited.sd) && !std::isnan(m.effect.sd)) {
      note += "the limited measurement's standard deviation is not in every findings.json (files written before "
              "2026-12-04 keep min and max only): it is left out. ";
      m.has_limit = false;
    }
    if (m.effect.n < 2 || std::isnan(m.effect.sd)) {
      r["note"] = note + (m.effect.n < 2 ? "fewer than 2 seeds in all: no spread to model"
                                         : "no figure: the effect's standard deviation is not in every findings.json "
                                           "(files written before 2026-12-04 keep min and max only)");
      out.push_back(r);
      continue;
    }
    json odds = json::array();
    for (int n : kGrid) odds.push_back(odds_json(sample_odds(m, n, draws, sample_seed(n))));
    r["odds"] = odds;
    r["decided"] = kDecided;
    r["seeds_for_decided"] = seeds_for_decision(m, kDecided, draws);
    if (m.rule.interval != "t") note += "the rule reads the seeds' range, which widens as seeds are added: no seed "
                                        "count is searched for. ";
    if (!note.empty()) r["note"] = note.substr(0, note.size() - 1);
    out.push_back(r);
  }
  return {{"draws", draws}, {"findings", out}};
}

}  // namespace hlm::study
