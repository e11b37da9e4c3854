#pragma once
// Needle-in-a-haystack prompts (a generator, used by evaluation, probes and NIAH-mixed training): a
// key-value sentence "The special magic number for {key} is: {value}." at a chosen depth of a haystack,
// followed by the question, in exactly `length` tokens.
#include <string>
#include <vector>

#include "data/haystack.h"

namespace hlm {

struct NiahCase {
  std::vector<int32_t> prompt;  // exactly `length` tokens
  std::string key, value;       // the expected answer is `value`
  i64 value_begin = 0, value_end = 0;  // token span of the value inside the prompt (retrieval-head probe)
  i64 length = 0;
  double depth = 0;
  i64 max_new_tokens = 0;
};

// The value has `value_digits` digits (7 by default). Throws hlm::Error when `length` is too short for the
// needle and the question.
NiahCase make_niah_case(const data::Tokenizer& tok, const Haystack& hay, i64 length, double depth, Rng& rng,
                        int value_digits = 7);

// The shortest `length` that make_niah_case accepts for every key and value with this tokenizer: the needle
// and the question at their longest (a value counts one token per byte, the most any tokenizer here gives).
i64 niah_min_length(const data::Tokenizer& tok, int value_digits);

}  // namespace hlm
