#include "eval/probes.h"

#include <cctype>
#include <cmath>
#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "infer/sampler.h"
#include "mixers/attention.h"

namespace hlm {

std::vector<i64> restricted_layers(const ModelConfig& cfg, const std::string& spec) {
  std::vector<i64> out;
  if (spec == "none") return out;
  if (spec == "full" || spec == "efficient") {
    for (i64 l = 0; l < cfg.n_layers; ++l)
      if ((cfg.letter(l) == 'F') == (spec == "full")) out.push_back(l);
    return out;
  }
  if (spec.rfind("layer:", 0) == 0) {
    std::stringstream ss(spec.substr(6));
    std::string item;
    while (std::getline(ss, item, ',')) {
      i64 l = -1;
      try {
        l = std::stol(item);
      } catch (const std::exception&) {
        fail("--restrict {}: '{}' is not a layer index", spec, item);
      }
      if (l < 0 || l >= cfg.n_layers) fail("--restrict {}: layer {} is out of range (0..{})", spec, l, cfg.n_layers - 1);
      out.push_back(l);
    }
    if (out.empty()) fail("--restrict {}: no layers listed", spec);
    return out;
  }
  fail("--restrict '{}': expected full, efficient, none or layer:i,j", spec);
}

void apply_max_span(Model& model, const std::vector<i64>& layers, i64 span) {
  for (i64 l = 0; l < model.config().n_layers; ++l) model.mixer(l).set_max_span(0);
  for (i64 l : layers) model.mixer(l).set_max_span(span);
}

std::vector<double> retrieval_scores_for_case(const std::vector<std::vector<i64>>& top1,
                                              const std::vector<int32_t>& generated,
                                              const std::vector<int32_t>& prompt, i64 begin, i64 end) {
  HLM_CHECK(top1.size() == generated.size(), "retrieval score: {} steps of attention but {} generated tokens",
            top1.size(), generated.size());
  const size_t heads = top1.empty() ? 0 : top1[0].size();
  std::vector<double> score(heads, 0.0);
  const double w = end > begin ? 1.0 / static_cast<double>(end - begin) : 0.0;
  for (size_t k = 0; k < top1.size(); ++k)
    for (size_t h = 0; h < heads; ++h) {
      const i64 p = top1[k][h];
      if (p >= begin && p < end && p < static_cast<i64>(prompt.size()) && prompt[p] == generated[k]) score[h] += w;
    }
  return score;
}

int value_digits_recalled(const std::string& answer, const std::string& value) {
  size_t i = 0;
  while (i < answer.size() && !std::isdigit(static_cast<unsigned char>(answer[i]))) {
    if (std::isalpha(static_cast<unsigned char>(answer[i]))) return 0;  // a word first: no number given
    ++i;
  }
  int right = 0;
  for (size_t k = 0; k < value.size() && i + k < answer.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(answer[i + k]))) break;
    right += answer[i + k] == value[k];
  }
  return right;
}

RetrievalScores retrieval_head_scores(Model& model, const data::Tokenizer& tok, const Haystack& hay,
                                      const std::vector<i64>& lengths, const std::vector<double>& depths, int samples,
                                      std::uint64_t seed, bool progress, int value_digits) {
  const i64 NL = model.config().n_layers, V = model.config().vocab_size;
  RetrievalScores r;
  std::vector<AttentionMixer*> attn(static_cast<size_t>(NL), nullptr);
  std::vector<AttentionRecord> rec(static_cast<size_t>(NL));
  i64 max_heads = 0;
  for (i64 l = 0; l < NL; ++l) {
    attn[l] = dynamic_cast<AttentionMixer*>(&model.mixer(l));
    r.is_attention.push_back(attn[l] != nullptr);
    if (attn[l]) max_heads = std::max(max_heads, attn[l]->n_heads());
  }
  r.score.assign(static_cast<size_t>(NL), std::vector<double>(static_cast<size_t>(max_heads), 0.0));
  for (i64 l = 0; l < NL; ++l)
    if (!attn[l]) std::fill(r.score[l].begin(), r.score[l].end(), NAN);
  Rng rng(seed);
  std::vector<float> logits(static_cast<size_t>(V));
  double correct = 0;
  const int total = static_cast<int>(lengths.size() * depths.size()) * samples;
  for (i64 L : lengths)
    for (double d : depths)
      for (int s = 0; s < samples; ++s) {
        NiahCase c = make_niah_case(tok, hay, L, d, rng, value_digits);
        const i64 P = static_cast<i64>(c.prompt.size());
        DecodeState st = model.new_decode_state(1, P + c.max_new_tokens + 1);
        if (P > 1) model.prefill(c.prompt.data(), 1, P - 1, st, nullptr);
        for (i64 l = 0; l < NL; ++l)
          if (attn[l]) attn[l]->set_record(&rec[l]);
        std::vector<std::vector<std::vector<i64>>> top1(static_cast<size_t>(NL));  // [layer][step][head]
        int32_t tok_in = c.prompt.back();
        std::vector<int32_t> out;
        for (i64 k = 0; k < c.max_new_tokens; ++k) {
          model.decode_step(&tok_in, st, logits.data());
          const int32_t y = argmax(logits.data(), V);
          out.push_back(y);
          for (i64 l = 0; l < NL; ++l)
            if (attn[l]) top1[l].push_back(rec[l].top1);
          tok_in = y;
        }
        for (i64 l = 0; l < NL; ++l)
          if (attn[l]) attn[l]->set_record(nullptr);
        // Keep the test when more than half of the value's digits are right (all of them for 2 digits).
        const std::string text = tok.decode(out);
        correct += niah_score(text, c.value);
        ++r.cases;
        if (2 * value_digits_recalled(text, c.value) > static_cast<int>(c.value.size())) {
          ++r.kept;
          for (i64 l = 0; l < NL; ++l)
            if (attn[l]) {
              auto sc = retrieval_scores_for_case(top1[l], out, c.prompt, c.value_begin, c.value_end);
              for (size_t h = 0; h < sc.size(); ++h) r.score[l][h] += sc[h];
            }
        }
        if (progress)
          fmt::print(stderr, "\r\033[Kretrieval heads: case {}/{} | kept {} | accuracy {:.2f}", r.cases, total, r.kept,
                     correct / r.cases);
      }
  if (progress) fmt::print(stderr, "\n");
  for (i64 l = 0; l < NL; ++l)
    if (attn[l])
      for (auto& v : r.score[l]) v = r.kept ? v / r.kept : 0.0;
  r.accuracy = r.cases ? correct / r.cases : 0.0;
  return r;
}

std::vector<std::vector<double>> attention_map(Model& model, const std::vector<int32_t>& tokens, i64 layer, i64 head) {
  if (layer < 0 || layer >= model.config().n_layers)
    fail("attention map: layer {} is out of range (0..{})", layer, model.config().n_layers - 1);
  auto* a = dynamic_cast<AttentionMixer*>(&model.mixer(layer));
  if (!a) fail("attention map: layer {} is a '{}' layer, not softmax attention", layer, model.config().letter(layer));
  if (head < 0 || head >= a->n_heads()) fail("attention map: head {} is out of range (0..{})", head, a->n_heads() - 1);
  const i64 T = static_cast<i64>(tokens.size());
  AttentionRecord rec;
  rec.keep_probs = true;
  a->set_record(&rec);
  DecodeState st = model.new_decode_state(1, T);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  for (i64 t = 0; t < T; ++t) model.decode_step(&tokens[t], st, logits.data());
  a->set_record(nullptr);
  std::vector<std::vector<double>> m(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(T), 0.0));
  for (i64 i = 0; i < T; ++i)
    for (size_t j = 0; j < rec.probs[i][head].size(); ++j) m[i][j] = rec.probs[i][head][j];
  return m;
}

}  // namespace hlm
