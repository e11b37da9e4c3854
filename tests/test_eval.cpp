// Long-context evaluation generators and scorers: exact lengths, determinism by seed, hand-made answers.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "data/byte_tokenizer.h"
#include "eval/niah.h"
#include "eval/ruler.h"
#include "model/config.h"
#include "model/model.h"

using namespace hlm;

TEST(Niah, ScoreIsExactMatchOfTheFirstNumber) {
  EXPECT_EQ(niah_score(" 4721093.", "4721093"), 1.0);
  EXPECT_EQ(niah_score("4721093\nThe", "4721093"), 1.0);
  EXPECT_EQ(niah_score(" 47210931", "4721093"), 0.0);   // longer number
  EXPECT_EQ(niah_score(" 472109", "4721093"), 0.0);     // prefix only
  EXPECT_EQ(niah_score(" the 4721093", "4721093"), 0.0);  // words before the number
  EXPECT_EQ(niah_score("", "4721093"), 0.0);
}

TEST(Niah, CasesHaveTheExactLengthAndTheValueSpanAndAreSeeded) {
  data::ByteTokenizer tok;
  Haystack noise(tok);
  for (i64 L : {400, 777, 2048}) {
    i64 prev = -1;
    for (double d : {0.0, 0.37, 1.0}) {
      Rng r1(5), r2(5);
      NiahCase a = make_niah_case(tok, noise, L, d, r1);
      NiahCase b = make_niah_case(tok, noise, L, d, r2);
      EXPECT_EQ(static_cast<i64>(a.prompt.size()), L);
      EXPECT_EQ(a.prompt, b.prompt);
      std::vector<int32_t> span(a.prompt.begin() + a.value_begin, a.prompt.begin() + a.value_end);
      EXPECT_EQ(tok.decode(span), " " + a.value);
      // Depth: deeper needles sit later; at a long length the position is about d of the way through.
      EXPECT_GT(a.value_begin, prev);
      prev = a.value_begin;
      if (L == 2048) {
        EXPECT_NEAR(static_cast<double>(a.value_begin) / L, d, 0.12) << d;
      }
    }
  }
  Rng r(1);
  EXPECT_THROW(make_niah_case(tok, noise, 50, 0.5, r), Error);
}

TEST(Ruler, EveryTaskHasTheExactLengthAndIsDeterministic) {
  data::ByteTokenizer tok;
  Haystack noise(tok);
  std::vector<QaItem> qa = {{"Who wrote it?", {"Alice"}, {"Alice wrote the book in 1999."}},
                            {"Where is it?", {"Paris"}, {"It is in Paris, near the river."}},
                            {"What color?", {"blue"}, {"The car is blue and fast."}}};
  auto tasks = ruler_task_names();
  tasks.push_back("qa");
  for (const auto& t : tasks)
    for (i64 L : {1500, 3000}) {
      Rng a(9), b(9);
      RulerSample s1 = make_ruler_sample(t, L, tok, noise, nullptr, &qa, a);
      RulerSample s2 = make_ruler_sample(t, L, tok, noise, nullptr, &qa, b);
      EXPECT_EQ(static_cast<i64>(s1.prompt.size()), L) << t;
      EXPECT_EQ(s1.prompt, s2.prompt) << t;
      EXPECT_EQ(s1.references, s2.references) << t;
      ASSERT_FALSE(s1.references.empty()) << t;
      const std::string text = tok.decode(s1.prompt);
      if (t.rfind("niah", 0) == 0 || t == "vt" || t == "qa") {
        for (auto& ref : s1.references) EXPECT_NE(text.find(ref), std::string::npos) << t << ": " << ref;
      }
    }
}

TEST(Ruler, CommonWordsReferencesAreTheMostFrequentWords) {
  data::ByteTokenizer tok;
  Haystack noise(tok);
  Rng r(3);
  RulerSample s = make_ruler_sample("cwe", 4000, tok, noise, nullptr, nullptr, r);
  std::map<std::string, int> count;
  std::istringstream in(tok.decode(s.prompt));
  std::string w;
  while (in >> w)
    if (w.size() == 6 && std::all_of(w.begin(), w.end(), ::islower)) count[w]++;
  int min_ref = 1 << 30, max_other = 0;
  for (auto& [word, c] : count) {
    bool ref = std::find(s.references.begin(), s.references.end(), word) != s.references.end();
    if (ref) min_ref = std::min(min_ref, c);
    else max_other = std::max(max_other, c);
  }
  EXPECT_EQ(s.references.size(), 10u);
  EXPECT_GT(min_ref, max_other);
}

TEST(Ruler, StringMatchMetricsOnHandMadeAnswers) {
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123, 456.", {"123", "456"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123.", {"123", "456"}), 50.0);
  EXPECT_DOUBLE_EQ(string_match_all("nothing", {"123"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("ALICE did", {"alice"}), 100.0);  // case-insensitive
  EXPECT_DOUBLE_EQ(string_match_part("It was Bob", {"Alice", "Bob"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("It was Carol", {"Alice", "Bob"}), 0.0);
}

#include "eval/longppl.h"

// A toy evaluator with known long-context tokens: a target is predictable (loss 0.1) when the token 100
// positions earlier is identical (a "copy" the model can only see with long context), else loss 5.0.
// The short context (K = 32) cannot see 100 back, so exactly the copy positions become key tokens.
TEST(LongPpl, ConstructedCasePicksExactlyTheKnownKeyTokens) {
  const i64 L = 400, lag = 100;
  std::vector<int32_t> doc(L);
  Rng r(2);
  for (i64 i = 0; i < L; ++i) doc[i] = static_cast<int32_t>(1000 + r.below(100000));
  std::vector<i64> copies = {150, 151, 260, 333, 399};
  for (i64 p : copies) doc[p] = doc[p - lag];
  SequenceScorer toy = [&](const std::vector<int32_t>& t) {
    std::vector<double> out(t.size(), 0.0);
    for (size_t j = 1; j < t.size(); ++j) out[j] = (j >= static_cast<size_t>(lag) && t[j] == t[j - lag]) ? 0.1 : 5.0;
    return out;
  };
  LongPplConfig c;
  c.trunc_len = 32;
  c.block = 16;
  KeyTokens k = find_key_tokens(toy, doc, c);
  std::vector<i64> got;
  for (i64 p = 0; p < L; ++p)
    if (k.is_key[p]) got.push_back(p);
  EXPECT_EQ(got, copies);
  // Every position from K on is scored with a short context; none before.
  for (i64 p = 0; p < L; ++p) EXPECT_EQ(std::isnan(k.loss_short[p]), p < c.trunc_len) << p;
  // A copy inside the first K tokens can never be a key token.
  auto j = run_longppl(toy, toy, {doc}, c);
  EXPECT_EQ(j["key_tokens"].get<i64>(), 5);
  EXPECT_NEAR(j["longppl"].get<double>(), std::exp(0.1), 1e-12);
}

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/plot.h"

// A grouped bar chart draws one bar per finite value (NaN = no bar), a whisker where min < max, a legend
// swatch per series, and refuses a file name that is not .svg.
TEST(Plot, BarChartDrawsABarPerFiniteValue) {
  hlm::BarChart b;
  b.title = "t";
  b.groups = {"swa", "gdn"};
  b.series = {"none", "full", "efficient"};
  b.values = {{1.0, 0.5}, {0.0, NAN}, {0.9, 0.25}};
  b.lo = {{0.8, 0.5}, {0.0, NAN}, {0.9, 0.2}};
  b.hi = {{1.0, 0.5}, {0.0, NAN}, {0.9, 0.3}};
  const auto path = std::filesystem::temp_directory_path() / ("hlm_bars_" + std::to_string(::getpid()) + ".svg");
  hlm::write_bar_chart(b, path.string());
  std::ifstream f(path);
  const std::string svg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = svg.find(needle); p != std::string::npos; p = svg.find(needle, p + 1)) ++n;
    return n;
  };
  // rects: background, frame, 5 bars, 3 legend swatches
  EXPECT_EQ(count("<rect"), 2u + 5u + 3u);
  EXPECT_EQ(count("stroke=\"#222\""), 2u);  // whiskers: swa/none 0.8..1.0, gdn/efficient 0.2..0.3
  EXPECT_NE(svg.find(">efficient<"), std::string::npos);
  EXPECT_THROW(hlm::write_bar_chart(b, "bars.png"), hlm::Error);
}

// A length too short for a task's fixed text fails the run, or with skip_too_short is scored null and listed,
// and each length's average is over the tasks that fit there.
TEST(Ruler, TooShortCellsFailOrAreSkippedAndLeftOutOfTheAverage) {
  data::ByteTokenizer tok;
  Haystack noise(tok);
  nlohmann::json j = {{"d_model", 16}, {"n_layers", 1}, {"n_heads", 2}, {"n_kv_heads", 2}, {"head_dim", 8},
                      {"d_ff", 32}, {"vocab_size", tok.vocab_size()}, {"max_seq_len", 2048}, {"pattern", "F"}};
  Model model(ModelConfig::from_json(j, "test"));
  model.init(1);
  RulerConfig c;
  c.tasks = {"niah_single_1", "vt"};
  c.lengths = {40, 1200};  // 40 bytes hold neither task's instructions; 1200 hold both
  c.samples = 1;
  c.progress = false;
  EXPECT_THROW(run_ruler(model, tok, noise, nullptr, nullptr, c), RulerTooShort);
  c.skip_too_short = true;
  const nlohmann::json r = run_ruler(model, tok, noise, nullptr, nullptr, c);
  ASSERT_EQ(r["skipped"].size(), 2u);
  for (auto& sk : r["skipped"]) {
    EXPECT_EQ(sk["length"], 40);
    EXPECT_NE(sk["reason"].get<std::string>().find("too short"), std::string::npos);
  }
  EXPECT_TRUE(r["average"][0].is_null());
  for (const char* t : {"niah_single_1", "vt"}) {
    EXPECT_TRUE(r["tasks"][t][0].is_null()) << t;
    EXPECT_TRUE(r["tasks"][t][1].is_number()) << t;
  }
  const double mean = (r["tasks"]["niah_single_1"][1].get<double>() + r["tasks"]["vt"][1].get<double>()) / 2;
  EXPECT_DOUBLE_EQ(r["average"][1].get<double>(), mean);
}
