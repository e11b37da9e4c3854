#pragma once
// Mechanism probes: receptive-field restriction per layer type, retrieval-head scores (Wu et al.) per
// (layer, head) during needle copying, and attention maps.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/niah.h"
#include "model/model.h"

namespace hlm {

// "full" -> layers with letter F; "efficient" -> every other layer (S, L, M, G); "layer:i,j" -> those;
// "none" -> no layer. hlm::Error for anything else or a layer index out of range.
std::vector<i64> restricted_layers(const ModelConfig& cfg, const std::string& spec);
// Caps how far back the given layers see (0 = uncapped); every other layer is uncapped.
void apply_max_span(Model& model, const std::vector<i64>& layers, i64 span);

// Retrieval scores [layer][head] (NaN rows for layers without softmax attention) averaged over the NIAH
// cases whose answer was retrieved (more than half of the value's digits right); see docs/probes.md.
struct RetrievalScores {
  std::vector<std::vector<double>> score;  // [layer][head]
  std::vector<char> is_attention;          // per layer
  int cases = 0, kept = 0;
  double accuracy = 0;  // NIAH exact-match accuracy over the cases
};
// One test's retrieval score per head (Wu et al.): at decode step k, head h scores 1/(end - begin) when
// its most-attended position top1[k][h] lies in the needle span [begin, end) and the token generated at
// that step equals the prompt token there (a copy-paste event).
std::vector<double> retrieval_scores_for_case(const std::vector<std::vector<i64>>& top1,
                                              const std::vector<int32_t>& generated,
                                              const std::vector<int32_t>& prompt, i64 begin, i64 end);

// How many of the value's digits the answer gets right: the first number in `answer` (only whitespace and
// punctuation may come before it, as for the NIAH score) compared digit by digit with `value`, left-aligned.
// Digits, not tokens: a leading-space token or a one-token guess must not count (a constant " 66" against the
// 2-digit value 61 would keep the test on 2 of its 3 tokens, 1 of its 2 digits does not).
int value_digits_recalled(const std::string& answer, const std::string& value);

RetrievalScores retrieval_head_scores(Model& model, const data::Tokenizer& tok, const Haystack& hay,
                                      const std::vector<i64>& lengths, const std::vector<double>& depths, int samples,
                                      std::uint64_t seed, bool progress, int value_digits = 7);

// The attention of one head of one attention layer while the model reads `tokens` (B = 1, token by token):
// probs[i][j] = weight of query i on key j (0 for j > i or outside the window).
std::vector<std::vector<double>> attention_map(Model& model, const std::vector<int32_t>& tokens, i64 layer, i64 head);

}  // namespace hlm
