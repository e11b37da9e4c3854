#pragma once
// Needle-in-a-haystack: a key-value sentence ("The special magic number for {key} is: {value}.") placed
// at a chosen depth of a haystack, prompts of an exact token length, greedy decoding, exact-match score.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/haystack.h"
#include "model/model.h"

namespace hlm {

struct NiahCase {
  std::vector<int32_t> prompt;  // exactly `length` tokens
  std::string key, value;       // the expected answer is `value`
  i64 value_begin = 0, value_end = 0;  // token span of the value inside the prompt (retrieval-head probe)
  i64 length = 0;
  double depth = 0;
  i64 max_new_tokens = 0;
};

// Throws hlm::Error when `length` is too short for the needle and the question.
NiahCase make_niah_case(const data::Tokenizer& tok, const Haystack& hay, i64 length, double depth, Rng& rng);

// 1 when the first number in `prediction` equals `value` exactly (leading spaces ignored), else 0.
double niah_score(const std::string& prediction, const std::string& value);

struct NiahGridConfig {
  std::vector<i64> lengths;
  std::vector<double> depths;
  int samples = 4;
  std::uint64_t seed = 42;
  bool progress = true;
};

// Accuracy grid [depth][length] and the mean, as JSON:
// {"lengths", "depths", "accuracy": [[...]], "mean", "samples", "cases": [{length, depth, value, prediction, correct}]}
nlohmann::json run_niah_grid(Model& model, const data::Tokenizer& tok, const Haystack& hay, const NiahGridConfig& c);

// Greedy completion of a prompt (B = 1), decoded to text.
std::string complete(Model& model, const data::Tokenizer& tok, const std::vector<int32_t>& prompt, i64 max_new_tokens);

}  // namespace hlm
