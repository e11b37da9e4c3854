// Sizing a fresh sample of seeds (study/sample_size.h, `reproduce --sample-size`): pooling separate samples is exact,
// the simulated odds follow the rule where it is deterministic and the normal approximation where n is large, the
// figures are reproducible, and the committed studies give the pilot numbers docs/reproduce.md quotes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_harness.h"
#include "study/sample_size.h"

using namespace hlm::study;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

SeedRule t_rule() {
  SeedRule r;
  r.interval = "t";
  return r;
}

SampleModel model(double mean, double sd, double margin) {
  SampleModel m;
  m.effect = {.n = 6, .mean = mean, .min = mean - sd, .max = mean + sd, .sd = sd};
  m.margin = margin;
  m.rule = t_rule();
  return m;
}

json committed(const std::string& folder) {
  std::ifstream f(fs::path(HLM_SOURCE_DIR) / "docs" / "results-reproduce" / folder / "findings.json");
  return json::parse(f);
}

const json& finding(const json& r, const std::string& id) {
  for (auto& f : r["findings"])
    if (f["id"] == id) return f;
  throw std::runtime_error("no finding " + id);
}

}  // namespace

TEST(SampleSize, PoolingSeparateSamplesEqualsTheSpreadOfAllTheirValues) {
  const std::vector<double> a{0.1, 0.5, 0.3}, b{-0.2, 0.4}, c{0.7};
  std::vector<double> all(a);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  const Spread p = pooled({spread_of(a), spread_of(b), spread_of(c), Spread{}}), s = spread_of(all);
  EXPECT_EQ(p.n, 6);
  EXPECT_NEAR(p.mean, s.mean, 1e-15);
  EXPECT_NEAR(p.sd, s.sd, 1e-15);
  EXPECT_EQ(p.min, -0.2);
  EXPECT_EQ(p.max, 0.7);
}

// With no spread every sample is the pilot itself, so the rule's reading is certain; one seed never decides.
TEST(SampleSize, WithoutSpreadTheOddsAreTheRulesReading) {
  const SampleOdds holds = sample_odds(model(0.5, 0, 0.1), 3, 100, 7);
  EXPECT_EQ(holds.holds, 1.0);
  const SampleOdds below = sample_odds(model(0.0, 0, 0.1), 3, 100, 7);
  EXPECT_EQ(below.does_not_hold, 1.0);
  EXPECT_EQ(sample_odds(model(0.5, 0.1, 0.1), 1, 100, 7).inconclusive, 1.0);

  SampleModel limited = model(0.5, 0, 0.1);  // finding a or d: a second measurement bounded from above
  limited.has_limit = true;
  limited.limit = 0.03;
  limited.limited = {.n = 6, .mean = 0.05, .min = 0.05, .max = 0.05, .sd = 0};
  EXPECT_EQ(sample_odds(limited, 4, 100, 7).does_not_hold, 1.0);  // its lower bound above the limit
  limited.limited.mean = limited.limited.min = limited.limited.max = 0.02;
  EXPECT_EQ(sample_odds(limited, 4, 100, 7).holds, 1.0);
}

// Many seeds: the sample sd is close to the true one, so P(does not hold) = P(mean + t s / sqrt(n) < margin) is
// about Phi((margin - mu) / (sigma / sqrt(n)) - t) = Phi(0.05 / 0.02121 - 1.6766) = Phi(0.681) = 0.752 for
// mu 0, sigma 0.15, n 50 (the sd's own spread moves it by under 0.01), and P(holds) = P(mean >= margin) (lo > 0
// follows) = 1 - Phi(0.05 / 0.02121) = 1 - Phi(2.357) = 0.0092.
TEST(SampleSize, ManySeedsFollowTheNormalApproximation) {
  const SampleOdds o = sample_odds(model(0.0, 0.15, 0.05), 50, 20000, 3);
  EXPECT_NEAR(o.does_not_hold, 0.752, 0.02);
  EXPECT_NEAR(o.holds, 0.0092, 0.003);
  EXPECT_NEAR(o.holds + o.does_not_hold + o.inconclusive, 1.0, 1e-12);
}

TEST(SampleSize, FiguresAreReproducibleAndTheSeedCountIsTheFirstThatDecides) {
  const SampleModel m = model(0.25, 0.24, 0.1);
  const SampleOdds a = sample_odds(m, 6, 5000, 11), b = sample_odds(m, 6, 5000, 11);
  EXPECT_EQ(a.holds, b.holds);
  EXPECT_EQ(a.inconclusive, b.inconclusive);
  const int n = seeds_for_decision(m, 0.8, 5000);
  ASSERT_GT(n, 3);
  ASSERT_LT(n, 20);
  const auto decided = [&](int k) {
    const SampleOdds o = sample_odds(m, k, 5000, sample_seed(k));
    return o.holds + o.does_not_hold;
  };
  EXPECT_GE(decided(n), 0.8);
  EXPECT_LT(decided(n - 1), 0.8);
  SampleModel range = m;
  range.rule.interval = "range";  // the range widens with seeds: no count is searched for
  EXPECT_EQ(seeds_for_decision(range, 0.8, 5000), 0);
}

// The committed pilot of c (two 3-seed studies of 3000-step runs, bf16 and fp32): mean 0.242, sd 0.238 as
// docs/reproduce.md says; b has no figure; a's second measurement is the val-loss spread.
TEST(SampleSize, CommittedStudiesGiveTheDocumentedPilots) {
  const json c = sample_size(committed("c-x2-bf16-amx"), {committed("c-x2-fp32-amx")}, {"bf16", "fp32"}, 2000);
  const json& fc = finding(c, "c");
  EXPECT_EQ(fc["model"]["effect"]["n"], 6);
  EXPECT_NEAR(fc["model"]["effect"]["mean"].get<double>(), 0.2417, 1e-4);
  EXPECT_NEAR(fc["model"]["effect"]["sd"].get<double>(), 0.238, 1e-3);
  EXPECT_NEAR(fc["sources"][0]["effect"]["mean"].get<double>(), 0.25, 1e-9);  // +0.05, +0.45, +0.25
  EXPECT_EQ(fc["model"]["margin"], 0.1);
  EXPECT_EQ(fc["odds"].size(), 12u);
  EXPECT_GT(fc["seeds_for_decided"].get<int>(), 6);

  const json b = sample_size(committed("b-confirm-bf16-amx"), {}, {"b"}, 100);
  EXPECT_FALSE(finding(b, "b").contains("odds"));
  EXPECT_NE(finding(b, "b")["note"].get<std::string>().find("all or nothing"), std::string::npos);

  // The first study (original plan, 2026-12-03): its findings.json keeps no sd for a and d, and its rules read the
  // seeds' range. c's effects come from the onsets, so they have a figure, but no seed count is searched for.
  std::ifstream first(fs::path(HLM_SOURCE_DIR) / "docs" / "results-reproduce" / "findings.json");
  const json old = sample_size(json::parse(first), {}, {"first"}, 500);
  EXPECT_FALSE(finding(old, "a").contains("odds"));
  EXPECT_NE(finding(old, "a")["note"].get<std::string>().find("before 2026-12-04"), std::string::npos);
  EXPECT_TRUE(finding(old, "a")["model"]["effect"]["sd"].is_null());
  EXPECT_EQ(finding(old, "c")["seeds_for_decided"], 0);
  EXPECT_NE(finding(old, "c")["note"].get<std::string>().find("range"), std::string::npos);

  const json a = sample_size(committed("fp32-part-a-amx-onepass-7seeds"), {}, {"a"}, 2000);
  const json& fa = finding(a, "a");
  EXPECT_NEAR(fa["model"]["effect"]["mean"].get<double>(), -0.0907, 1e-4);
  EXPECT_NEAR(fa["model"]["limited"]["mean"].get<double>(), 0.0315, 1e-4);
  EXPECT_EQ(fa["model"]["limit"], 0.03);
}

TEST(SampleSize, CliPrintsTheOddsAndRefusesMissingFolders) {
  hlm::testing::ScratchDir tmp("hlm_sample_size_test_");
  const std::string dir = (fs::path(HLM_SOURCE_DIR) / "docs" / "results-reproduce").string();
  const auto r = hlm::testing::run_cli_in(tmp.path, "reproduce --out " + dir + "/c-x2-bf16-amx --sample-size --pilot " +
                                                        dir + "/c-x2-fp32-amx");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("effect +0.2417 (sd 0.238, 6 seeds)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not hold"), std::string::npos);
  EXPECT_NE(r.out.find("a fresh sample decides it"), std::string::npos) << r.out;
  hlm::testing::expect_cli_error(
      hlm::testing::run_cli_in(tmp.path, "reproduce --out " + (tmp.path / "none").string() + " --sample-size"),
      (tmp.path / "none" / "findings.json").string() + " does not exist");
  EXPECT_NE(hlm::testing::run_cli_in(tmp.path, "reproduce --out " + dir + "/c-x2-bf16-amx --pilot x").code, 0);
  EXPECT_NE(hlm::testing::run_cli_in(tmp.path, "reproduce --out " + dir + "/c-x2-bf16-amx --sample-size --report-only")
                .code, 0);
  // --only picks findings: of the 3-seed Zen 4 study's four, only d.
  const auto d = hlm::testing::run_cli_in(tmp.path, "reproduce --out " + dir + "/bf16-3seeds-amended --sample-size "
                                                    "--only d --json");
  ASSERT_EQ(d.code, 0) << d.err;
  const json j = json::parse(d.out);
  ASSERT_EQ(j["findings"].size(), 1u);
  EXPECT_EQ(j["findings"][0]["id"], "d");
  EXPECT_EQ(j["findings"][0]["model"]["limited_name"], "short-context loss NoPE - RoPE");
}
