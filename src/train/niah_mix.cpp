#include "train/niah_mix.h"

#include "core/error.h"

namespace hlm {

void NiahMixStream::check_row_length(i64 seq_len, int value_digits, const data::Tokenizer& tok) {
  const i64 need = niah_min_length(tok, value_digits);
  if (prompt_length(seq_len) < need)
    fail("--mix-niah: rows of --seq-len {} hold NIAH prompts of {} tokens (--seq-len + 1 - {} for the answer), but "
         "the needle and question need {} tokens with tokenizer {} and --niah-digits {}; give --seq-len >= {} or "
         "fewer --niah-digits",
         seq_len, prompt_length(seq_len), kAnswerReserve, need, tok.spec(), value_digits,
         need + kAnswerReserve - 1);
}

void NiahMixStream::next(Batch& b) {
  base_.next(b);
  const std::uint64_t k = counter_++;
  const i64 T = b.T;
  for (i64 r = 0; r < b.B; ++r) {
    Rng rng(seed_ ^ (0x9e3779b97f4a7c15ULL * (k + 1)) ^ (0xbf58476d1ce4e5b9ULL * static_cast<std::uint64_t>(row_offset_ + r + 1)));
    if (rng.uniform() >= fraction_) continue;
    NiahCase c = make_niah_case(tok_, hay_, prompt_length(T), rng.uniform(), rng, value_digits_);
    std::vector<int32_t> seq = c.prompt;
    auto ans = tok_.encode(" " + c.value + ".\n");
    seq.insert(seq.end(), ans.begin(), ans.end());
    if (static_cast<i64>(seq.size()) > T + 1) seq.resize(static_cast<size_t>(T + 1));
    auto tail = hay_.take(T + 1 - static_cast<i64>(seq.size()), rng);
    seq.insert(seq.end(), tail.begin(), tail.end());
    for (i64 t = 0; t < T; ++t) {
      b.inputs[r * T + t] = seq[t];
      b.targets[r * T + t] = seq[t + 1];
      if (!b.doc_start.empty()) b.doc_start[r * T + t] = 0;
    }
  }
}

}  // namespace hlm
