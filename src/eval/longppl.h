#pragma once
// LongPPL (Fang et al., ICLR 2025): perplexity on the tokens that need long context. An evaluator model
// scores each token with its full context and with a truncated one; a token is a key token when the
// long-short difference LSD = loss_short - loss_full > alpha and the long-context log-prob
// LCL = -loss_full > beta (defaults alpha 2, beta -2, losses in nats). LongPPL of the evaluated model is
// exp(mean of its full-context loss over key tokens), aggregated over documents weighted by key-token
// count. Short contexts follow LongPPL's windowing (docs/algorithms.md §8.1): scored in blocks of `block`; a block
// starting at s (s = 0, block, 2*block, ...) is scored from the short context [s, p) for p in
// [s+trunc, s+trunc+block), so the first `trunc` tokens are never key tokens.
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shard.h"
#include "model/model.h"

namespace hlm {

struct LongPplConfig {
  i64 trunc_len = 128;  // K: the short context
  i64 block = 64;       // scored block size
  double alpha = 2.0, beta = -2.0;
};

// Per-target losses of a token sequence: out[j] = -log P(tokens[j] | tokens[0..j-1]) for j >= 1 (out[0] = 0).
using SequenceScorer = std::function<std::vector<double>(const std::vector<int32_t>& tokens)>;
SequenceScorer model_scorer(Model& model);

struct KeyTokens {
  std::vector<double> loss_full, loss_short;  // per position (short = NaN where not scored)
  std::vector<unsigned char> is_key;          // per position
  i64 count = 0;
};

// Key tokens of one document, with the evaluator given as a scorer.
KeyTokens find_key_tokens(const SequenceScorer& evaluator, const std::vector<int32_t>& doc, const LongPplConfig& c);

// Documents: LongPPL over docs with the evaluated model's full-context losses.
// {"longppl", "ppl", "key_tokens", "tokens", "documents", "per_document": [...]}
nlohmann::json run_longppl(const SequenceScorer& evaluated, const SequenceScorer& evaluator,
                           const std::vector<std::vector<int32_t>>& docs, const LongPplConfig& c);

// Up to n documents of exactly doc_len tokens, each the start of one corpus document that is at least
// that long (so the context never crosses a document boundary). hlm::Error when none is long enough.
std::vector<std::vector<int32_t>> long_documents(const data::TokenShard& shard, i64 doc_len, int n);

}  // namespace hlm
