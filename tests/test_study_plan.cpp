// Study plans (src/study/plan.h): the shipped plan loads, and malformed plans, unknown presets and impossible
// budgets are refused naming the file and field. Links only the readers of untrusted files, so it is also part of
// the sanitized reader tests (docs/reliability.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_harness.h"
#include "core/error.h"
#include "study/plan.h"

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
  // Finding d trains twice the budget's steps (amended 2026-12-05), rounded to whole eval intervals.
  EXPECT_EQ(p.findings[3].steps_factor, 2);
  EXPECT_EQ(p.findings[2].steps_factor, 2);  // and finding c's (amended 2026-12-06)
  EXPECT_EQ(p.findings[0].steps_factor, 1);
  EXPECT_EQ(p.findings[1].steps_factor, 1);
  EXPECT_EQ(scaled_steps(p.budgets.at("small"), p.findings[3].steps_factor), 3000);
  EXPECT_EQ(scaled_steps(tiny, 1.6), 100);  // 96 -> 5 intervals of 20
  EXPECT_EQ(p.amendments.size(), 3u);
  EXPECT_EQ(tiny.train_args, (std::vector<std::string>{"--eval-batches", "2", "--lr", "0.003", "--warmup", "10"}));
  EXPECT_TRUE(fs::path(tiny.data).is_absolute());  // "../docs" is relative to the plan file
  EXPECT_GT(p.mix_niah, 0);
  EXPECT_FALSE(p.proxy_note.empty());
}

// Every plan shipped beside the paper's loads too (studies/*.json).
TEST(StudyPlan, EveryShippedPlanLoads) {
  int n = 0;
  for (auto& e : fs::directory_iterator(fs::path(default_plan_path()).parent_path()))
    if (e.path().extension() == ".json") {
      SCOPED_TRACE(e.path().string());
      const StudyPlan p = load_study_plan(e.path().string(), train_option);
      EXPECT_FALSE(p.findings.empty());
      ++n;
    }
  EXPECT_GE(n, 2);
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
  j["findings"]["d"]["steps_factor"] = 0.5;
  expect_refused("steps_factor_below_one", j, {"field 'findings.d.steps_factor'", "[1, 100]"});
  j["findings"]["d"]["steps_factor"] = "2";
  expect_refused("steps_factor_text", j, {"findings.d.steps_factor"});
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
  j["budgets"]["small"]["train"]["precision"] = "bf16";
  expect_refused("precision_in_plan", j, {"field 'budgets.small.train.precision'", "reproduce --precision"});
  j = shipped();
  j["findings"]["b"]["rule"]["learned_mn"] = 0.3;
  expect_refused("unknown_rule_key", j, {"unknown field 'findings.b.rule.learned_mn'"});
  j = shipped();
  j["findings"]["b"]["rule"].erase("margin");
  expect_refused("missing_rule_key", j, {"field 'findings.b.rule.margin' is missing"});
  j = shipped();
  j["findings"]["b"]["rule"]["interval"] = "sigma";
  expect_refused("unknown_interval", j, {"field 'findings.b.rule.interval'", "\"range\"", "\"t\""});
  j = shipped();
  j["findings"]["b"]["rule"]["interval"] = "t";
  j["findings"]["b"]["rule"]["confidence"] = 1.5;
  expect_refused("confidence_over_one", j, {"field 'findings.b.rule.confidence'", "[0.5, 1)"});
  j = shipped();
  j["findings"]["b"]["rule"]["interval"] = "range";
  j["findings"]["b"]["rule"]["confidence"] = 0.9;
  expect_refused("confidence_without_t", j, {"field 'findings.b.rule.confidence'", "only applies"});
  j = shipped();
  j["findings"]["b"]["rule"]["interval"] = "t";
  j["findings"]["b"]["rule"]["min_seeds"] = 1;
  expect_refused("t_with_one_seed", j, {"field 'findings.b.rule.min_seeds'", "one seed has no spread"});
  j = shipped();
  j["amendments"] = {"ok", 3};
  expect_refused("amendment_not_text", j, {"field 'amendments[1]'"});
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
