// The study layer (src/study/): the verdict rules give holds / does not hold / inconclusive on synthetic per-seed
// results as docs/reproduce.md says; the recall sweep's choice of learning rate. (Plans: test_study_plan.cpp.)
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "study/recall_sweep.h"
#include "study/task_graph.h"
#include "study/verdict.h"

using namespace hlm;
using namespace hlm::study;
using nlohmann::json;

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

// An inconclusive reading with t bounds says how many seeds the same mean and spread would need to decide it: the
// laziness effects of 3000-step runs (bf16 and fp32 on the Emerald Rapids Xeon) need 4 and 7 seeds to read "holds";
// a small mean below the margin needs 5 to read "does not hold". The range reading and one seed give no figure.
TEST(StudyVerdict, InconclusiveReasonSaysHowManySeedsWouldDecide) {
  SeedRule t;
  t.interval = "t";
  EXPECT_EQ(seeds_to_decide(spread_of({0.05, 0.45, 0.25}), 0.1, t), 4);
  EXPECT_EQ(seeds_to_decide(spread_of({0.05, 0.6, 0.05}), 0.1, t), 7);
  EXPECT_EQ(seeds_to_decide(spread_of({0.0, 0.1, -0.05}), 0.1, t), 5);
  // One seed fewer does not decide: the figure is the fewest.
  const auto half_width = [](const std::vector<double>& e, int n) {
    return student_t_quantile(0.95, n - 1) * spread_of(e).sd / std::sqrt(static_cast<double>(n));
  };
  EXPECT_LE(0.25 - half_width({0.05, 0.45, 0.25}, 3), 0);
  EXPECT_LE(spread_of({0.05, 0.6, 0.05}).mean - half_width({0.05, 0.6, 0.05}, 6), 0);
  EXPECT_GE(spread_of({0.0, 0.1, -0.05}).mean + half_width({0.0, 0.1, -0.05}, 4), 0.1);
  const VerdictResult r = directional({0.05, 0.45, 0.25}, 0.1, t);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_NE(r.reason.find("within the seed spread (with this mean and spread, 4 seeds would read 'holds'"),
            std::string::npos) << r.reason;
  const VerdictResult below = directional({0.0, 0.1, -0.05}, 0.1, t);
  EXPECT_NE(below.reason.find("5 seeds would read 'does not hold'"), std::string::npos) << below.reason;
  // With 4 seeds of the first case's mean and spread the rule itself decides: the figure is consistent with it.
  const double m = 0.25, sd = 0.2, d = sd * std::sqrt(3.0 / 4.0);  // four values with mean m and sample sd `sd`
  EXPECT_EQ(directional({m - d, m - d, m + d, m + d}, 0.1, t).verdict, Verdict::kHolds);
  EXPECT_EQ(seeds_to_decide(spread_of({0.05, 0.45, 0.25}), 0.1, SeedRule{}), 0);  // the range reading: no figure
  EXPECT_EQ(seeds_to_decide(spread_of({0.3}), 0.1, t), 0);                         // one seed: no spread
  EXPECT_EQ(seeds_to_decide(spread_of({-0.2, 0.2}), -0.5, t), 0);  // mean 0 >= margin: lo > 0 never comes
  EXPECT_EQ(directional({0.0, 0.6, 0.3}, 0.3, 2).reason.find("seeds would read"), std::string::npos);  // range
}

// An effect exactly at a rule's threshold is decided by the rule (mean >= margin holds), not by which way its
// floating-point value rounded: seven seeds' onset effects of the laziness finding (in fractions of a 1500-step run)
// average to 0.0999... for a 0.1 margin, and 0.7 - 0.4 is 0.29999999999999993.
TEST(StudyVerdict, ExactTiesAreDecidedByTheRuleNotByRounding) {
  std::vector<double> onsets;
  for (double d : {-150.0, 300.0, 300.0, 300.0, 0.0, 0.0, 300.0}) onsets.push_back(d / 1500);
  ASSERT_LT(spread_of(onsets).mean, 0.1);  // the rounding the rule must not see
  SeedRule t;
  t.interval = "t";
  const VerdictResult seven = directional(onsets, 0.1, t);
  EXPECT_EQ(seven.verdict, Verdict::kHolds) << seven.reason;
  const double tie = 0.7 - 0.4;
  ASSERT_LT(tie, 0.3);
  EXPECT_EQ(directional({tie, tie}, 0.3, 2).verdict, Verdict::kHolds);  // sd 0: the bounds are the mean
  EXPECT_EQ(directional({tie, tie}, 0.3 + 1e-6, 2).verdict, Verdict::kDoesNotHold);  // a real shortfall still counts
  // NIAH means on the learned_min threshold: 0.1 + 0.2 is above 0.3 by an ulp, 0.7 - 0.4 below it; both learned.
  const json rule = {{"learned_min", 0.3}, {"margin", 0.3}, {"min_seeds", 2}};
  for (double base : {0.1 + 0.2, tie}) {
    ReceptiveInput in;
    in.hybrids = {"swa"};
    in.seeds = {{{base, 0.0, base}, {base, 0.0, base}}};
    const VerdictResult r = verdict_receptive_field(in, rule, nullptr);
    EXPECT_EQ(r.verdict, Verdict::kHolds) << base << ": " << r.reason;
  }
}

// Student t quantiles against the printed tables (one-sided p, dof).
TEST(StudyVerdict, StudentTQuantilesMatchTheTables) {
  EXPECT_NEAR(student_t_quantile(0.95, 1), 6.313752, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 2), 2.919986, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 4), 2.131847, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.975, 10), 2.228139, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.99, 30), 2.457262, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.995, 3), 5.840909, 1e-5);
  EXPECT_DOUBLE_EQ(student_t_cdf(0, 7), 0.5);
  EXPECT_NEAR(student_t_cdf(-2.131847, 4), 0.05, 1e-7);
  EXPECT_NEAR(student_t_cdf(1.0, 1), 0.75, 1e-12);  // Cauchy: 1/2 + atan(1)/pi
}

// The t interval narrows with seeds where the range only grows: the same spread of effects is inconclusive at 3
// seeds under both readings and holds at 5 seeds under "t" only.
TEST(StudyVerdict, DirectionalRuleWithTBounds) {
  SeedRule t;
  t.interval = "t";
  const std::vector<double> three = {0.10, 0.18, 0.44}, five = {0.10, 0.18, 0.44, 0.20, 0.28};
  EXPECT_EQ(directional(three, 0.1, SeedRule{}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(directional(three, 0.1, t).verdict, Verdict::kInconclusive);
  EXPECT_EQ(directional(five, 0.1, SeedRule{}).verdict, Verdict::kInconclusive);
  const VerdictResult r = directional(five, 0.1, t);
  EXPECT_EQ(r.verdict, Verdict::kHolds) << r.reason;
  EXPECT_NE(r.reason.find("95% t bounds of the mean over 5 seeds"), std::string::npos) << r.reason;
  // mean 0.24, sd 0.12884: bounds 0.24 -/+ 2.131847 x 0.1327 / sqrt(5).
  const Bounds b = bounds_of(spread_of(five), t);
  EXPECT_NEAR(b.lo, 0.24 - 2.131847 * 0.128841 / std::sqrt(5.0), 1e-5);
  EXPECT_NEAR(b.hi, 0.24 + 2.131847 * 0.128841 / std::sqrt(5.0), 1e-5);
  // Clearly below the margin: does not hold under both.
  EXPECT_EQ(directional({0.01, -0.02, 0.0, 0.02}, 0.1, t).verdict, Verdict::kDoesNotHold);
  // A higher confidence widens the bounds.
  SeedRule strict = t;
  strict.confidence = 0.999;  // t(0.999, 4) = 7.17
  EXPECT_EQ(directional(five, 0.1, strict).verdict, Verdict::kInconclusive);
  EXPECT_EQ(SeedRule::from(json{{"interval", "t"}, {"confidence", 0.9}, {"min_seeds", 3}}).min_seeds, 3);
  EXPECT_EQ(SeedRule::from(json::object()).interval, "range");
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

// The progress line's ETA: children work in parallel at the rate finished tasks showed over their own run time.
TEST(TaskGraph, EtaCountsParallelChildrenAndTheWorkOfRunningTasks) {
  using hlm::study::eta_seconds;
  EXPECT_LT(eta_seconds(100, 0, 0, {}, 2), 0);  // nothing finished in this sitting: unknown
  EXPECT_EQ(eta_seconds(0, 0, 0, {}, 0), 0);  // nothing left: 0, known without a rate
  // Two children; one task of weight 10 took 10 s (1 per second); the other child has run 9 s of a 10-weight task;
  // left: that task and one of 20, 30 in all. 9 of it done, 21 left at 2 per second.
  EXPECT_DOUBLE_EQ(eta_seconds(30, 10, 10, {{10, 9}}, 2), 10.5);
  // A running task is credited at most its weight (it ran longer than the rate says it needs).
  EXPECT_DOUBLE_EQ(eta_seconds(30, 10, 10, {{10, 25}}, 2), 10);
  // The first report of a 2-job study (the case that read twice the truth when the rate was weight over wall time):
  // 19 trainings of weight 1 (one of 2) and 1 done after 228 s; the other child 228 s into its weight-2 task.
  EXPECT_NEAR(eta_seconds(19, 1, 228, {{2, 228}}, 2), 18 * 228 / 2.0, 1e-9);
  EXPECT_DOUBLE_EQ(eta_seconds(5, 5, 10, {}, 1), 10);  // one child: left weight over its rate
  EXPECT_DOUBLE_EQ(eta_seconds(2, 2, 4, {{2, 8}}, 1), 0);  // the last task is overdue: 0, not negative
}
