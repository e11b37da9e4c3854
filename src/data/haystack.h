#pragma once
// Haystack text for long-context tasks: token streams cut from a corpus shard (documents joined, <eos>
// removed) or the classic repeated noise sentences, and the needle vocabulary (keys, values).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace hlm {

class Haystack {
 public:
  // Corpus haystack from a token shard (<eos> tokens dropped so the text reads as one context).
  Haystack(std::shared_ptr<const data::TokenShard> shard, const data::Tokenizer& tok);
  // Noise haystack: "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
  explicit Haystack(const data::Tokenizer& tok);
  // Exactly n tokens of haystack starting at a seeded position.
  std::vector<int32_t> take(i64 n, Rng& rng) const;
  bool is_noise() const { return !shard_; }
  // Tokens a corpus haystack draws from (its shard's, <eos> included); 0 for noise, which repeats without end.
  i64 source_tokens() const;

 private:
  std::shared_ptr<const data::TokenShard> shard_;
  std::vector<int32_t> noise_;
  int32_t eos_ = -1;
};

// "adjective-noun" keys and 7-digit values, deterministic by rng.
std::string random_key(Rng& rng);
std::vector<std::string> all_random_keys();  // every key random_key can return
std::string random_number(Rng& rng, int digits = 7);
std::string random_word(Rng& rng, int letters);  // lowercase letters

}  // namespace hlm
