#include "eval/longppl.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace hlm {

SequenceScorer model_scorer(Model& model) {
  return [&model](const std::vector<int32_t>& tokens) {
    const i64 n = static_cast<i64>(tokens.size());
    std::vector<double> out(static_cast<size_t>(n), 0.0);
    if (n < 2) return out;
    std::vector<int32_t> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
    std::vector<float> tl(static_cast<size_t>(n - 1));
    model.forward(in.data(), tg.data(), nullptr, 1, n - 1, nullptr, tl.data());
    for (i64 j = 1; j < n; ++j) out[j] = tl[j - 1];
    return out;
  };
}

KeyTokens find_key_tokens(const SequenceScorer& evaluator, const std::vector<int32_t>& doc, const LongPplConfig& c) {
  HLM_CHECK(c.trunc_len >= 1 && c.block >= 1, "longppl: trunc_len and block must be >= 1 (got {}, {})", c.trunc_len,
            c.block);
  const i64 L = static_cast<i64>(doc.size());
  KeyTokens k;
  k.loss_full = evaluator(doc);
  k.loss_short.assign(static_cast<size_t>(L), std::numeric_limits<double>::quiet_NaN());
  k.is_key.assign(static_cast<size_t>(L), 0);
  for (i64 s = 0; s + c.trunc_len < L; s += c.block) {
    const i64 e = std::min(L, s + c.trunc_len + c.block);
    std::vector<int32_t> win(doc.begin() + s, doc.begin() + e);
    std::vector<double> ls = evaluator(win);
    for (i64 p = s + c.trunc_len; p < e; ++p) k.loss_short[p] = ls[p - s];
  }
  for (i64 p = c.trunc_len; p < L; ++p) {
    if (std::isnan(k.loss_short[p])) continue;
    const double lsd = k.loss_short[p] - k.loss_full[p], lcl = -k.loss_full[p];
    if (lsd > c.alpha && lcl > c.beta) {
      k.is_key[p] = 1;
      ++k.count;
    }
  }
  return k;
}

nlohmann::json run_longppl(const SequenceScorer& evaluated, const SequenceScorer& evaluator,
                           const std::vector<std::vector<int32_t>>& docs, const LongPplConfig& c) {
  double key_sum = 0, all_sum = 0;
  i64 key_n = 0, all_n = 0;
  nlohmann::json per = nlohmann::json::array();
  for (const auto& d : docs) {
    KeyTokens k = find_key_tokens(evaluator, d, c);
    std::vector<double> lf = &evaluated == &evaluator ? k.loss_full : evaluated(d);
    double ks = 0, as = 0;
    for (size_t p = 1; p < d.size(); ++p) {
      as += lf[p];
      if (k.is_key[p]) ks += lf[p];
    }
    key_sum += ks;
    key_n += k.count;
    all_sum += as;
    all_n += static_cast<i64>(d.size()) - 1;
    per.push_back({{"tokens", d.size()}, {"key_tokens", k.count},
                   {"longppl", k.count ? nlohmann::json(std::exp(ks / k.count)) : nlohmann::json()},
                   {"ppl", std::exp(as / std::max<double>(1, static_cast<double>(d.size()) - 1))}});
  }
  return {{"longppl", key_n ? nlohmann::json(std::exp(key_sum / key_n)) : nlohmann::json()},
          {"log_longppl", key_n ? nlohmann::json(key_sum / key_n) : nlohmann::json()},
          {"ppl", all_n ? std::exp(all_sum / all_n) : 0.0},
          {"key_tokens", key_n},
          {"tokens", all_n},
          {"documents", docs.size()},
          {"trunc_len", c.trunc_len},
          {"block", c.block},
          {"alpha", c.alpha},
          {"beta", c.beta},
          {"per_document", per}};
}

std::vector<std::vector<int32_t>> long_documents(const data::TokenShard& shard, i64 doc_len, int n) {
  std::vector<std::vector<int32_t>> docs;
  const i64 N = shard.n_tokens();
  const int32_t eos = shard.eos_id();
  i64 start = 0, longest = 0;
  for (i64 i = 0; i <= N && static_cast<int>(docs.size()) < n; ++i) {
    if (i == N || shard[i] == eos) {
      longest = std::max(longest, i - start);
      if (i - start >= doc_len) {
        std::vector<int32_t> d(static_cast<size_t>(doc_len));
        shard.read(start, doc_len, d.data());
        docs.push_back(std::move(d));
      }
      start = i + 1;
    }
  }
  if (docs.empty())
    fail("{}: no document has {} tokens (the longest has {}); use a smaller --doc-len", shard.path(), doc_len, longest);
  return docs;
}

}  // namespace hlm
