// The study layer (src/study/): the plan loader refuses malformed plans, unknown presets and impossible
// budgets naming the file and field; the verdict rules give holds / does not hold / inconclusive on
// synthetic per-seed results as docs/reproduce.md says.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cli_harness.h"
#include "core/error.h"
#include "study/plan.h"
#include "study/recall_sweep.h"
#include "study/verdict.h"

using namespace hlm;
using namespace hlm::study;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A stand-in for `hybridlm train`'s options: a few with values, one switch.
int train_option(const std::string& flag) {
  if (flag == "--lr" || flag == "--warmup" || flag == "--eval-batches" || flag == "--schedule") return 1;
  if (flag == "--check-numerics") return 0;
  return -1;
}

json shipped() {
  std::ifstream f(default_plan_path());
  return json::parse(f);
}

fs::path write_plan(const std::string& name, const json& j) {
  static const hlm::testing::ScratchDir root("hlm_study_test_");
  const fs::path& dir = root.path;
  const fs::path p = dir / (name + ".json");
  std::ofstream(p) << j.dump(2);
  return p;
}

// The plan `j` must be refused with every needle in the message (the file name is always one).
void expect_refused(const std::string& name, const json& j, const std::vector<std::string>& needles) {
  const fs::path p = write_plan(name, j);
  try {
    load_study_plan(p.string(), train_option);
    ADD_FAILURE() << name << ": accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p.string()), std::string::npos) << m;
    for (auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "want '" << n << "' in: " << m;
  }
}

}  // namespace

TEST(StudyPlan, ShippedPlanLoadsWithWindowsScaledToTheTrainingLength) {
  const StudyPlan p = load_study_plan(default_plan_path(), train_option);
  EXPECT_EQ(p.hybrids.size(), 7u);
  ASSERT_EQ(p.findings.size(), 4u);
  EXPECT_EQ(p.findings[0].id, "a");
  EXPECT_EQ(p.findings[3].hybrids, (std::vector<std::string>{"swa-small", "swa-small-nope"}));
  const BudgetSpec& tiny = p.budgets.at("tiny");
  EXPECT_EQ(tiny.seq_len, 384);
  EXPECT_EQ(p.window_tokens(p.hybrid("swa-small"), tiny), 12);   // 384 / 32
  EXPECT_EQ(p.window_tokens(p.hybrid("swa-mid"), tiny), 48);     // 384 / 8
  EXPECT_EQ(p.window_tokens(p.hybrid("swa-large"), tiny), 192);  // 384 / 2
  EXPECT_EQ(p.window_tokens(p.hybrid("swa-small"), p.budgets.at("small")), 4);  // 128 / 32
  EXPECT_EQ(p.window_tokens(p.hybrid("lightning"), tiny), 0);
  EXPECT_EQ(p.budgets.at("medium").steps, 81920000 / (16 * 512));  // tokens -> steps
  EXPECT_EQ(p.budgets.at("small").seeds, 3);
  EXPECT_EQ(tiny.train_args, (std::vector<std::string>{"--eval-batches", "2", "--lr", "0.003", "--warmup", "10"}));
  EXPECT_TRUE(fs::path(tiny.data).is_absolute());  // "../docs" is relative to the plan file
  EXPECT_GT(p.mix_niah, 0);
  EXPECT_FALSE(p.proxy_note.empty());
}

TEST(StudyPlan, MalformedUnknownAndImpossibleAreRefusedNamingFileAndField) {
  const fs::path bad = write_plan("broken", json::object());
  std::ofstream(bad) << "{\"version\": 1,";
  EXPECT_THROW(
      {
        try {
          load_study_plan(bad.string(), train_option);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos);
          throw;
        }
      },
      Error);
  json j = shipped();
  j["colour"] = 1;
  expect_refused("unknown_top", j, {"unknown field 'colour'"});
  j = shipped();
  j["hybrids"]["swa-mid"]["preset"] = "swa9999";
  expect_refused("unknown_preset", j, {"field 'hybrids.swa-mid.preset'", "swa9999"});
  j = shipped();
  j["hybrids"]["swa-mid"]["window"] = "huge";
  expect_refused("unknown_window", j, {"field 'hybrids.swa-mid.window'", "huge"});
  j = shipped();
  j["budgets"]["tiny"]["steps"] = 50;  // eval_every 20
  expect_refused("steps_not_multiple", j, {"field 'budgets.tiny.eval_every'", "not a multiple"});
  j = shipped();
  j["budgets"]["tiny"]["steps"] = 40;
  expect_refused("too_few_checkpoints", j, {"field 'budgets.tiny.steps'", "at least 3"});
  j = shipped();
  j["budgets"]["tiny"]["steps"] = -60;
  expect_refused("negative_steps", j, {"field 'budgets.tiny.steps'", "whole number"});
  j = shipped();
  j["budgets"]["medium"]["tokens"] = 81920001;
  expect_refused("tokens_not_whole_steps", j, {"field 'budgets.medium.tokens'", "not a whole number of steps"});
  j = shipped();
  j["budgets"]["tiny"]["tokens"] = 61440;  // and steps
  expect_refused("steps_and_tokens", j, {"'steps' or as 'tokens'"});
  j = shipped();
  j["budgets"]["tiny"]["seq_len"] = 4096;  // over the budget's max_seq_len (1536)
  j["budgets"]["tiny"]["max_eval_tokens"] = 8192;
  expect_refused("seq_len_over_model", j, {"field 'budgets.tiny.seq_len'", "max_seq_len"});
  j = shipped();
  j["budgets"]["small"]["seq_len"] = 512;  // finding d asks for 4x = 2048 > 1024
  expect_refused("lengths_over_model", j, {"findings.d.options.lengths", "max_seq_len"});
  j = shipped();
  j["budgets"]["tiny"]["set"].push_back("d_modle=64");
  expect_refused("bad_model_key", j, {"field 'budgets.tiny.set'", "d_modle"});
  j = shipped();
  j["budgets"]["tiny"]["train"]["learning_rate"] = 0.1;
  expect_refused("unknown_train_flag", j, {"field 'budgets.tiny.train.learning_rate'", "no option --learning-rate"});
  j = shipped();
  j["budgets"]["tiny"]["train"]["seq_len"] = 64;
  expect_refused("reserved_train_flag", j, {"field 'budgets.tiny.train.seq_len'", "set by the study"});
  j = shipped();
  j["findings"]["b"]["rule"]["learned_mn"] = 0.3;
  expect_refused("unknown_rule_key", j, {"unknown field 'findings.b.rule.learned_mn'"});
  j = shipped();
  j["findings"]["b"]["rule"].erase("margin");
  expect_refused("missing_rule_key", j, {"field 'findings.b.rule.margin' is missing"});
  j = shipped();
  j["findings"]["c"]["hybrids"].push_back("swa-huge");
  expect_refused("unknown_hybrid", j, {"field 'findings.c.hybrids[3]'", "swa-huge"});
  j = shipped();
  j["findings"]["c"]["hybrids"].push_back("gdn");
  expect_refused("no_window", j, {"field 'findings.c.hybrids'", "no SWA window"});
  j = shipped();
  j["findings"]["e"] = j["findings"]["a"];
  expect_refused("unknown_finding", j, {"unknown field 'findings.e'"});
  j = shipped();
  j["windows"]["small"] = 1.5;
  expect_refused("window_fraction", j, {"field 'windows.small'"});
}

// ---- verdict rules on synthetic results ----

TEST(StudyVerdict, DirectionalRule) {
  EXPECT_EQ(directional({0.9, 0.8, 1.0}, 0.3, 2).verdict, Verdict::kHolds);
  EXPECT_EQ(directional({0.0, 0.01, -0.01}, 0.3, 2).verdict, Verdict::kDoesNotHold);
  EXPECT_EQ(directional({-0.5, -0.4}, 0.3, 2).verdict, Verdict::kDoesNotHold);  // reversed
  const VerdictResult spread = directional({0.0, 0.6, 0.3}, 0.3, 2);
  EXPECT_EQ(spread.verdict, Verdict::kInconclusive);
  EXPECT_NE(spread.reason.find("within the seed spread"), std::string::npos) << spread.reason;
  const VerdictResult one = directional({0.9}, 0.3, 2);
  EXPECT_EQ(one.verdict, Verdict::kInconclusive);  // one seed: no spread to judge by
  EXPECT_NE(one.reason.find("1 seed"), std::string::npos) << one.reason;
  EXPECT_EQ(directional({0.9, NAN}, 0.3, 2).verdict, Verdict::kInconclusive);  // a missing seed does not count
  EXPECT_EQ(verdict_name(Verdict::kDoesNotHold), "does not hold");
}

TEST(StudyVerdict, ReceptiveField) {
  const json rule = {{"learned_min", 0.3}, {"margin", 0.3}, {"min_seeds", 2}};
  ReceptiveInput in;
  in.hybrids = {"swa", "gdn"};
  in.seeds = {{{1.0, 0.0, 1.0}, {0.9, 0.1, 0.9}}, {{0.8, 0.0, 0.7}, {1.0, 0.0, 1.0}}};
  json details;
  EXPECT_EQ(verdict_receptive_field(in, rule, &details).verdict, Verdict::kHolds);
  EXPECT_EQ(details["per_hybrid"]["gdn"]["verdict"], "holds");
  // gdn's efficient layers carry retrieval instead: capping full changes nothing.
  in.seeds[1] = {{0.8, 0.8, 0.0}, {1.0, 0.9, 0.1}};
  EXPECT_EQ(verdict_receptive_field(in, rule, nullptr).verdict, Verdict::kDoesNotHold);
  // gdn never learned retrieval: the finding cannot be decided for it.
  in.seeds[1] = {{0.0, 0.0, 0.0}, {0.1, 0.0, 0.1}};
  const VerdictResult r = verdict_receptive_field(in, rule, nullptr);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.reason.find("did not learn"), std::string::npos) << r.reason;
}

TEST(StudyVerdict, LargeWindowLaziness) {
  const json rule = {{"heads_min", 1}, {"margin_fraction", 0.1}, {"min_seeds", 2}};
  LazinessInput in;
  in.hybrids = {"small", "mid", "large"};
  in.steps = 1000;
  in.eval_every = 100;
  in.onset = {{200, 300}, {400, 500}, {NAN, 900}};  // never = 1100
  EXPECT_EQ(verdict_laziness(in, rule, nullptr).verdict, Verdict::kHolds);
  in.onset = {{800, 900}, {400, 500}, {200, 300}};  // larger windows earlier
  EXPECT_EQ(verdict_laziness(in, rule, nullptr).verdict, Verdict::kDoesNotHold);
  in.onset = {{NAN, NAN}, {NAN, NAN}, {NAN, NAN}};
  const VerdictResult r = verdict_laziness(in, rule, nullptr);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.reason.find("did not learn"), std::string::npos) << r.reason;
  in.onset = {{200, 900}, {400, 500}, {600, 300}};  // seeds disagree
  EXPECT_EQ(verdict_laziness(in, rule, nullptr).verdict, Verdict::kInconclusive);
}

TEST(StudyVerdict, NopeOnTheFullLayers) {
  const json rule = {{"learned_min", 0.3}, {"margin", 0.1}, {"loss_tolerance", 0.05}, {"min_seeds", 2}};
  // {rope score, nope score, rope loss, nope loss}
  EXPECT_EQ(verdict_nope({{0.4, 0.7, 3.00, 3.01}, {0.5, 0.8, 3.02, 3.02}}, rule, nullptr).verdict, Verdict::kHolds);
  EXPECT_EQ(verdict_nope({{0.4, 0.7, 3.00, 3.30}, {0.5, 0.8, 3.02, 3.32}}, rule, nullptr).verdict,
            Verdict::kDoesNotHold);  // long context better, short-context loss much worse
  EXPECT_EQ(verdict_nope({{0.6, 0.6, 3.0, 3.0}, {0.7, 0.7, 3.0, 3.0}}, rule, nullptr).verdict, Verdict::kDoesNotHold);
  const VerdictResult r = verdict_nope({{0.0, 0.1, 3.0, 3.0}, {0.0, 0.0, 3.0, 3.0}}, rule, nullptr);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.reason.find("neither learned"), std::string::npos) << r.reason;
}

TEST(StudyVerdict, Scaling) {
  const json rule = {{"loss_spread_max", 0.03}, {"margin", 0.05}, {"min_seeds", 2}};
  ScalingInput in;
  in.hybrids = {"swa-small", "swa-large", "gdn"};
  in.largest_window = "swa-large";
  // {early log LongPPL, final log LongPPL, final val loss}
  in.seeds = {{{3.0, 2.00, 4.00}, {3.1, 2.01, 4.01}},
              {{3.6, 2.05, 4.02}, {3.7, 2.04, 4.03}},
              {{3.2, 2.02, 4.01}, {3.3, 2.03, 4.00}}};
  json details;
  EXPECT_EQ(verdict_scaling(in, rule, &details).verdict, Verdict::kHolds);
  EXPECT_EQ(details["largest_window_lags_most"], "2 of 2 seeds");
  in.seeds[2] = {{3.2, 2.02, 4.50}, {3.3, 2.03, 4.60}};  // gdn's val loss far off
  EXPECT_EQ(verdict_scaling(in, rule, nullptr).verdict, Verdict::kDoesNotHold);
  in.seeds[2] = {{NAN, NAN, 4.01}, {NAN, NAN, 4.00}};  // no key tokens
  const VerdictResult r = verdict_scaling(in, rule, nullptr);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.reason.find("did not give"), std::string::npos) << r.reason;
}

// recall's policy: the lr with the best mean over seeds; an lr with any diverged seed is out; ties keep the first.
TEST(RecallSweep, BestLearningRateIsTheBestMeanOverSeedsWithoutDivergence) {
  using hlm::study::RecallTrial;
  const std::vector<RecallTrial> trials = {
      {1e-3, 1, 0.50}, {1e-3, 2, 0.70},         // mean 0.60
      {3e-3, 1, 0.90}, {3e-3, 2, 0.0, true},    // best single run, but a seed diverged: out
      {1e-2, 1, 0.75}, {1e-2, 2, 0.50},         // mean 0.625: the best
      {3e-2, 1, 0.625}, {3e-2, 2, 0.625}};      // mean 0.625 too (exact in binary): a tie keeps 1e-2
  const auto best = hlm::study::best_learning_rate(trials);
  ASSERT_TRUE(best.found);
  EXPECT_EQ(best.lr, 1e-2);
  EXPECT_EQ(best.accuracy, 0.625);
  EXPECT_FALSE(hlm::study::best_learning_rate({{1e-3, 1, 0.5, true}}).found);
  EXPECT_FALSE(hlm::study::best_learning_rate({}).found);
}
