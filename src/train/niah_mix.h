#pragma once
// Mixes needle-in-a-haystack sequences into a training stream: each row is, with probability `fraction`,
// replaced by a NIAH prompt followed by its answer (" {value}.") and more haystack, exactly T+1 tokens.
// This is how a small model is taught retrieval so retrieval heads can form (issue: Large-Window Laziness).
// Deterministic: the choice and content of row r of the k-th batch depend only on (seed, k, r), where r
// counts rows of the whole micro-batch over all ranks (a rank's rows start at `row_offset` = rank x batch),
// so N ranks x batch b mix the same rows as one process x batch N*b.
#include "data/niah_task.h"
#include "train/trainer.h"

namespace hlm {

class NiahMixStream final : public BatchStream {
 public:
  NiahMixStream(BatchStream& base, const data::Tokenizer& tok, const Haystack& hay, double fraction,
                std::uint64_t seed, int value_digits = 7, i64 row_offset = 0)
      : base_(base),
        tok_(tok),
        hay_(hay),
        fraction_(fraction),
        value_digits_(value_digits),
        row_offset_(row_offset),
        seed_(seed) {}
  void next(Batch& b) override;
  // The NIAH prompt length inside a row of T tokens (the rest holds the answer and more haystack): the
  // length a model trained on these rows is evaluated at.
  static i64 prompt_length(i64 T) { return T + 1 - kAnswerReserve; }
  static constexpr i64 kAnswerReserve = 24;
  // Refuses (naming --seq-len, --niah-digits and the shortest --seq-len that fits) rows of `seq_len` tokens
  // too short for the needle and question with this tokenizer.
  static void check_row_length(i64 seq_len, int value_digits, const data::Tokenizer& tok);
  nlohmann::json state() const override { return {{"base", base_.state()}, {"niah_batches", counter_}}; }
  void set_state(const nlohmann::json& s) override {
    base_.set_state(s.at("base"));
    counter_ = s.at("niah_batches").get<std::uint64_t>();
  }

 private:
  BatchStream& base_;
  const data::Tokenizer& tok_;
  const Haystack& hay_;
  double fraction_;
  int value_digits_;
  i64 row_offset_;
  std::uint64_t seed_, counter_ = 0;
};

}  // namespace hlm
