#pragma once
// Needle-in-a-haystack: a key-value sentence ("The special magic number for {key} is: {value}.") placed
// at a chosen depth of a haystack, prompts of an exact token length, greedy decoding, exact-match score.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/niah_task.h"
#include "model/model.h"

namespace hlm {

// 1 when the first number in `prediction` equals `value` exactly (leading spaces ignored), else 0.
double niah_score(const std::string& prediction, const std::string& value);

struct NiahGridConfig {
  std::vector<i64> lengths;
  std::vector<double> depths;
  int samples = 4;
  int value_digits = 7;  // digits of the needle's value
  std::uint64_t seed = 42;
  bool progress = true;
};

// Accuracy grid [depth][length] and the mean, as JSON:
// {"lengths", "depths", "accuracy": [[...]], "mean", "samples",
//  "cases": [{length, depth, key, value, value_begin, value_end, prediction, correct}]}
// (value_begin/value_end: the value's token span in the prompt, so a caller can tell how far back it lies).
nlohmann::json run_niah_grid(Model& model, const data::Tokenizer& tok, const Haystack& hay, const NiahGridConfig& c);

// Greedy completion of a prompt (B = 1), decoded to text.
std::string complete(Model& model, const data::Tokenizer& tok, const std::vector<int32_t>& prompt, i64 max_new_tokens);

}  // namespace hlm
