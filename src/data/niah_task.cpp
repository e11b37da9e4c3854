#include "data/niah_task.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace hlm {

namespace {

const char* kPrefix = "A special magic number is hidden in the following text. Remember it.\n";
const char* kPost = ".\n";
std::string needle_intro(const std::string& key) { return "\nThe special magic number for " + key + " is:"; }
std::string question(const std::string& key) {
  return "\nWhat is the special magic number for " + key + "? The special magic number for " + key + " is:";
}

}  // namespace

i64 niah_min_length(const data::Tokenizer& tok, int value_digits) {
  if (value_digits < 1) fail("niah: value_digits must be >= 1 (got {})", value_digits);
  i64 keyed = 0;
  for (const std::string& key : all_random_keys())
    keyed = std::max<i64>(keyed, static_cast<i64>(tok.encode(needle_intro(key)).size() + tok.encode(question(key)).size()));
  return static_cast<i64>(tok.encode(kPrefix).size() + tok.encode(kPost).size()) + keyed + 1 + value_digits +
         (tok.adds_bos() ? 1 : 0);
}

NiahCase make_niah_case(const data::Tokenizer& tok, const Haystack& hay, i64 length, double depth, Rng& rng,
                        int value_digits) {
  if (value_digits < 1) fail("niah: value_digits must be >= 1 (got {})", value_digits);
  NiahCase c;
  c.length = length;
  c.depth = depth;
  c.key = random_key(rng);
  c.value = random_number(rng, value_digits);
  // Encoded piece by piece so the value's token span inside the prompt is known exactly.
  auto prefix = tok.encode(kPrefix);
  if (tok.adds_bos()) prefix.insert(prefix.begin(), tok.bos_id());  // a released model reads <bos> first
  auto n_pre = tok.encode(needle_intro(c.key));
  auto n_val = tok.encode(" " + c.value);
  auto n_post = tok.encode(kPost);
  auto ask = tok.encode(question(c.key));
  const i64 fixed = static_cast<i64>(prefix.size() + n_pre.size() + n_val.size() + n_post.size() + ask.size());
  const i64 hay_len = length - fixed;
  if (hay_len < 0)
    fail("niah: length {} is too short for the needle and question ({} tokens with this tokenizer)", length, fixed);
  std::vector<int32_t> h = hay.take(hay_len, rng);
  const i64 at = std::min<i64>(hay_len, static_cast<i64>(std::floor(depth * static_cast<double>(hay_len))));
  auto& p = c.prompt;
  p.insert(p.end(), prefix.begin(), prefix.end());
  p.insert(p.end(), h.begin(), h.begin() + at);
  p.insert(p.end(), n_pre.begin(), n_pre.end());
  c.value_begin = static_cast<i64>(p.size());
  p.insert(p.end(), n_val.begin(), n_val.end());
  c.value_end = static_cast<i64>(p.size());
  p.insert(p.end(), n_post.begin(), n_post.end());
  p.insert(p.end(), h.begin() + at, h.end());
  p.insert(p.end(), ask.begin(), ask.end());
  c.max_new_tokens = static_cast<i64>(n_val.size()) + 3;
  return c;
}

}  // namespace hlm
