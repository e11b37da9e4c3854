#include "eval/niah.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "infer/generator.h"

namespace hlm {

double niah_score(const std::string& prediction, const std::string& value) {
  size_t i = 0;
  while (i < prediction.size() && !std::isdigit(static_cast<unsigned char>(prediction[i]))) {
    // Only whitespace and punctuation may precede the number; a word first means no answer.
    if (std::isalpha(static_cast<unsigned char>(prediction[i]))) return 0.0;
    ++i;
  }
  size_t j = i;
  while (j < prediction.size() && std::isdigit(static_cast<unsigned char>(prediction[j]))) ++j;
  return j > i && prediction.substr(i, j - i) == value ? 1.0 : 0.0;
}

std::string complete(Model& model, const data::Tokenizer& tok, const std::vector<int32_t>& prompt, i64 max_new_tokens) {
  GenerateConfig g;
  g.max_new_tokens = max_new_tokens;
  g.stop_token = tok.eos_id();
  auto out = generate(model, prompt, g);
  return tok.decode(out);
}

nlohmann::json run_niah_grid(Model& model, const data::Tokenizer& tok, const Haystack& hay, const NiahGridConfig& c) {
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::vector<double>> acc(c.depths.size(), std::vector<double>(c.lengths.size(), 0.0));
  Rng rng(c.seed);
  const size_t total = c.depths.size() * c.lengths.size() * static_cast<size_t>(c.samples);
  size_t done = 0;
  double sum = 0;
  for (size_t li = 0; li < c.lengths.size(); ++li)
    for (size_t di = 0; di < c.depths.size(); ++di)
      for (int s = 0; s < c.samples; ++s) {
        NiahCase k = make_niah_case(tok, hay, c.lengths[li], c.depths[di], rng, c.value_digits);
        std::string pred = complete(model, tok, k.prompt, k.max_new_tokens);
        double ok = niah_score(pred, k.value);
        acc[di][li] += ok / c.samples;
        sum += ok;
        cases.push_back({{"length", k.length}, {"depth", k.depth}, {"key", k.key}, {"value", k.value},
                         {"value_begin", k.value_begin}, {"value_end", k.value_end},
                         {"prediction", pred}, {"correct", ok > 0}});
        ++done;
        if (c.progress)
          fmt::print(stderr, "\r\033[Kniah: {}/{} | length {} depth {:.2f} | accuracy so far {:.3f}", done, total,
                     k.length, k.depth, sum / static_cast<double>(done));
      }
  if (c.progress) fmt::print(stderr, "\n");
  return {{"lengths", c.lengths}, {"depths", c.depths}, {"accuracy", acc}, {"samples", c.samples},
          {"mean", total ? sum / static_cast<double>(total) : 0.0}, {"cases", cases}};
}

}  // namespace hlm
