// Probes: receptive-field restriction is exact when it restricts nothing; retrieval scores on hand-built
// attention patterns.
#include <gtest/gtest.h>

#include "eval/probes.h"
#include "model/model.h"

using namespace hlm;

TEST(ReceptiveField, SpanAtLeastTheSequenceLengthChangesNothingExactly) {
  for (const char* pat : {"SF", "LF", "MF", "GF"}) {
    json j = {{"d_model", 32}, {"n_layers", 2}, {"n_heads", 2}, {"n_kv_heads", 2}, {"head_dim", 16},
              {"d_ff", 48}, {"vocab_size", 29}, {"max_seq_len", 64}, {"pattern", pat}, {"window", 8},
              {"chunk_size", 16}, {"mamba_d_state", 16}};
    Model m(ModelConfig::from_json(j, "test"));
    m.init(3);
    const i64 B = 2, T = 40;
    Rng r(1);
    std::vector<int32_t> in(B * T), tg(B * T);
    for (auto& x : in) x = static_cast<int32_t>(r.below(29));
    for (auto& x : tg) x = static_cast<int32_t>(r.below(29));
    std::vector<float> a(B * T), b(B * T);
    m.forward(in.data(), tg.data(), nullptr, B, T, nullptr, a.data());
    apply_max_span(m, restricted_layers(m.config(), "layer:0,1"), T);
    m.forward(in.data(), tg.data(), nullptr, B, T, nullptr, b.data());
    EXPECT_EQ(a, b) << pat;
    // A real restriction changes the losses.
    apply_max_span(m, restricted_layers(m.config(), "full"), 1);
    m.forward(in.data(), tg.data(), nullptr, B, T, nullptr, b.data());
    EXPECT_NE(a, b) << pat;
    apply_max_span(m, {}, 0);
  }
}

TEST(ReceptiveField, RestrictionSpecsSelectLayers) {
  Model m(resolve_config("swa128-nope", "", {"d_model=32", "n_heads=2", "n_kv_heads=2", "head_dim=16", "d_ff=32"}));
  EXPECT_EQ(restricted_layers(m.config(), "full"), (std::vector<i64>{3, 7}));
  EXPECT_EQ(restricted_layers(m.config(), "efficient"), (std::vector<i64>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(restricted_layers(m.config(), "layer:2,5"), (std::vector<i64>{2, 5}));
  EXPECT_THROW(restricted_layers(m.config(), "layer:9"), Error);
  EXPECT_THROW(restricted_layers(m.config(), "sideways"), Error);
}

TEST(RetrievalScore, HandBuiltCopyingHeadScoresOneAndOthersZero) {
  // Prompt with the needle value at positions 10..13; the model generates exactly those 4 tokens.
  std::vector<int32_t> prompt(20);
  for (int i = 0; i < 20; ++i) prompt[i] = 100 + i;
  const i64 begin = 10, end = 14;
  std::vector<int32_t> gen = {110, 111, 112, 113};
  // Head 0 always attends to the token it copies; head 1 attends to the first token; head 2 attends
  // inside the needle but to the wrong token; head 3 copies only half of the time.
  std::vector<std::vector<i64>> top1;
  for (int k = 0; k < 4; ++k) top1.push_back({10 + k, 0, 13 - k, k % 2 ? 10 + k : 5});
  auto s = retrieval_scores_for_case(top1, gen, prompt, begin, end);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_DOUBLE_EQ(s[1], 0.0);
  EXPECT_DOUBLE_EQ(s[2], 0.0);
  EXPECT_DOUBLE_EQ(s[3], 0.5);
}
