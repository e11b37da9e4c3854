#include "data/haystack.h"

#include "core/error.h"

namespace hlm {

namespace {
const char* kAdjectives[] = {"amber", "brave", "calm", "dusty", "eager", "fancy", "gentle", "hollow", "icy",
                             "jolly", "kind", "lucky", "mellow", "noble", "odd", "proud", "quiet", "rapid",
                             "silver", "tidy", "upbeat", "vivid", "witty", "young", "zesty", "bold", "crisp",
                             "daring", "early", "fuzzy", "grand", "humble"};
const char* kNouns[] = {"apple", "bridge", "castle", "dragon", "engine", "forest", "garden", "harbor", "island",
                        "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river",
                        "saddle", "tunnel", "umbrella", "valley", "window", "yacht", "zebra", "basket", "candle",
                        "desert", "falcon", "glacier", "hammer", "insect"};
}  // namespace

Haystack::Haystack(std::shared_ptr<const data::TokenShard> shard, const data::Tokenizer& tok)
    : shard_(std::move(shard)), eos_(tok.eos_id()) {
  if (shard_->n_tokens() < 16) fail("{}: too few tokens for a haystack", shard_->path());
}

Haystack::Haystack(const data::Tokenizer& tok) {
  noise_ = tok.encode("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ");
}

std::vector<int32_t> Haystack::take(i64 n, Rng& rng) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  if (!shard_) {
    while (static_cast<i64>(out.size()) < n) out.insert(out.end(), noise_.begin(), noise_.end());
    out.resize(static_cast<size_t>(n));
    return out;
  }
  const i64 N = shard_->n_tokens();
  i64 pos = static_cast<i64>(rng.below(static_cast<std::uint64_t>(N)));
  // A whole pass over the shard without a usable token means it holds only <eos>; any other shard gives
  // every length, wrapping around.
  i64 read = 0;
  while (static_cast<i64>(out.size()) < n) {
    int32_t t = (*shard_)[pos];
    if (t != eos_) out.push_back(t);
    pos = (pos + 1) % N;
    if (++read == N && out.empty()) fail("{}: haystack has no usable tokens (only <eos>)", shard_->path());
  }
  return out;
}

i64 Haystack::source_tokens() const { return shard_ ? shard_->n_tokens() : 0; }

std::string random_key(Rng& rng) {
  return std::string(kAdjectives[rng.below(32)]) + "-" + kNouns[rng.below(32)];
}

std::vector<std::string> all_random_keys() {
  std::vector<std::string> keys;
  for (const char* a : kAdjectives)
    for (const char* n : kNouns) keys.push_back(std::string(a) + "-" + n);
  return keys;
}

std::string random_number(Rng& rng, int digits) {
  std::string s(1, static_cast<char>('1' + rng.below(9)));
  for (int i = 1; i < digits; ++i) s += static_cast<char>('0' + rng.below(10));
  return s;
}

std::string random_word(Rng& rng, int letters) {
  std::string s;
  for (int i = 0; i < letters; ++i) s += static_cast<char>('a' + rng.below(26));
  return s;
}

}  // namespace hlm
