// NIAH measures a real learned retrieval: a tiny SWA + full-attention hybrid trained in the test on the
// engine's own NIAH rows (train/niah_mix.*: the make_niah_case prompt followed by its answer) and scored
// by the engine's own evaluation (eval/niah.*: run_niah_grid, greedy decoding through prefill/decode,
// exact match) retrieves the needle at its training length; a pure-SWA model trained the same way scores
// near chance when the needle lies outside its receptive field; and the hybrid with its full-attention
// layer cut to a span of 1 (eval/probes.*) drops to chance, while a span >= the length changes nothing.
// To fit the test budget the rows are short (64 tokens, a SentencePiece BPE model trained in the test from
// NIAH text, with pieces that span words), the value has 2 digits and the haystack is the noise haystack.
// Cost (Release, 1 thread, measured on the shared 2-core machine): ~20 s CPU, 20 s wall for the file (two
// trainings of ~10 s CPU each; the tokenizer trains in 0.1 s, the grids take milliseconds).
#include <gtest/gtest.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "data/byte_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "data/spm_trainer.h"
#include "eval/niah.h"
#include "eval/probes.h"
#include "model/model.h"
#include "train/niah_mix.h"
#include "train/trainer.h"

using namespace hlm;

namespace {

constexpr i64 kT = 64;            // training row length (NIAH prompts of NiahMixStream::prompt_length(64) = 41)
constexpr i64 kMaxLen = 96;       // model max_seq_len: the prompt plus every generated token fits
constexpr i64 kWindow = 4;        // SWA window: ".\n" and the question put the needle >= 12 tokens back
constexpr i64 kLayers = 2;
constexpr int kValueDigits = 2;   // exact match of a 2-digit number: chance 1/90

// A SentencePiece BPE model (data/spm_trainer.*, the project's tokenizer trainer) trained from 200 NIAH
// prompts, so the engine's NIAH prompt (~225 bytes of fixed text with the byte tokenizer) fits a short
// training row: pieces may span words (split_by_whitespace off) and hold up to 32 characters, so template
// phrases (" special magic number for") and most of the 64 key words become single pieces; digits stay single
// pieces (the trainer's split_digits), so a value is " " and one token a digit. Vocab: 259 special and byte
// pieces, 47 characters, the rest merges. Measured worst needle + question over all keys: 54 tokens at
// vocab 560, 42 at 680, 32 at 700, 28 at 740 (mean 26.2), 26 at 800; with 16-character pieces 33 at best.
constexpr int kVocab = 740;

std::unique_ptr<data::SentencePieceTokenizer> make_tokenizer() {
  data::ByteTokenizer bytes;
  Haystack noise(bytes);
  Rng rng(77);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back(bytes.decode(make_niah_case(bytes, noise, 400, rng.uniform(), rng).prompt));
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("hlm_test_niah_spm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  data::SpmTrainOptions opt;
  opt.vocab_size = kVocab;
  opt.threads = 1;
  opt.split_by_whitespace = false;
  opt.max_piece_chars = 32;
  const std::string path = (dir / "niah.model").string();
  data::train_sentencepiece(texts, path, opt);
  auto tok = std::make_unique<data::SentencePieceTokenizer>(path);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return tok;
}

// Rows of noise haystack; NiahMixStream (fraction 1) replaces every one by a NIAH row, so this only
// sets the batch shape.
class NoiseRows final : public BatchStream {
 public:
  NoiseRows(const Haystack& hay, i64 B) : hay_(hay), B_(B) {}
  void next(Batch& b) override {
    b.B = B_;
    b.T = kT;
    b.inputs.resize(static_cast<size_t>(B_ * kT));
    b.targets.resize(b.inputs.size());
    b.doc_start.clear();
    Rng rng(1);
    const auto seq = hay_.take(kT + 1, rng);
    for (i64 r = 0; r < B_; ++r)
      for (i64 t = 0; t < kT; ++t) {
        b.inputs[r * kT + t] = seq[t];
        b.targets[r * kT + t] = seq[t + 1];
      }
  }
  nlohmann::json state() const override { return nlohmann::json::object(); }
  void set_state(const nlohmann::json&) override {}

 private:
  const Haystack& hay_;
  i64 B_;
};

// One OpenMP thread for the tiny models (barriers would dominate on a shared machine), restored after.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
};

struct Fixture {
  std::unique_ptr<data::SentencePieceTokenizer> tok = make_tokenizer();
  Haystack hay{*tok};
  std::map<std::string, std::unique_ptr<Model>> models;
  std::map<std::string, double> train_seconds;
};

Fixture& fx() {
  static Fixture f;
  return f;
}

// The NIAH prompt length of a training row (the row holds the prompt, the answer and more haystack).
i64 prompt_length() { return NiahMixStream::prompt_length(kT); }

// `pattern` trained on NIAH rows; shared by the tests (trained once per process). Recipe: the std 0.06 init
// of test_recall.cpp (at d_model 64 the 0.02 init sits on a long plateau), QK-norm in the full-attention
// layer (without it the value copy had not formed after 2500 steps at length 128), AdamW lr 3e-3 constant,
// 1000 steps of 16 rows, init seed 2. Measured with this tokenizer: SF scores 1.000 for init seeds 1, 2, 3 at
// 1000 steps on AVX2; seeds 2 and 3 already at 500, seed 1 at 900 but not at 700 (lr 5e-3 was worse: seeds 1 and
// 3 at chance after 700 steps). Seed 1 sat on that edge: on AVX-512 (Zen 4) and the portable fallback, whose
// rounding differs (gradients agree with AVX2's to 5e-7 relative), it scored 0.000 after 1000 steps (AVX-512 still
// 0.025 after 2000). Seeds 2 and 3 score 1.000 at 1000 steps on AVX2, AVX-512 and the fallback alike.
Model& trained(const std::string& pattern) {
  Fixture& f = fx();
  auto it = f.models.find(pattern);
  if (it != f.models.end()) return *it->second;
  json j = {{"d_model", 64},    {"n_layers", kLayers},  {"n_heads", 2},          {"n_kv_heads", 2},
            {"head_dim", 32},   {"d_ff", 128},          {"vocab_size", kVocab},
            {"max_seq_len", kMaxLen}, {"pattern", pattern}, {"window", kWindow},
            {"layer_types", {{"F", {{"qk_norm", true}}}}}};
  auto m = std::make_unique<Model>(ModelConfig::from_json(j, "niah trained test"));
  m->init(2);
  for (const auto& p : m->registry().all())
    if (p.init == Init::Normal)
      for (i64 i = 0; i < p.shape.numel(); ++i) m->params()[p.offset + i] *= 3.0f;
  NoiseRows base(f.hay, 16);
  NiahMixStream stream(base, *f.tok, f.hay, 1.0, 8, kValueDigits);
  TrainConfig tc;
  tc.steps = 1000;
  tc.batch = 16;
  tc.seq_len = kT;
  tc.schedule.kind = "constant";
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup = 20;
  tc.eval_every = 0;
  tc.quiet = true;
  OneThread one;
  Timer t;
  Trainer(*m, tc, stream, nullptr).run();
  f.train_seconds[pattern] = t.seconds();
  return *f.models.emplace(pattern, std::move(m)).first->second;
}

json grid(Model& m) {
  NiahGridConfig c;
  c.lengths = {prompt_length()};
  c.depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  c.samples = 8;
  c.seed = 2024;
  c.progress = false;
  c.value_digits = kValueDigits;
  OneThread one;
  return run_niah_grid(m, *fx().tok, fx().hay, c);
}

}  // namespace

TEST(NiahTrained, HybridRetrievesTheNeedleAtItsTrainingLength) {
  Model& m = trained("SF");
  const json g = grid(m);
  const double acc = g.at("mean").get<double>();
  std::printf("niah: SF trained %.1f s, accuracy %.3f at length %lld\n", fx().train_seconds["SF"], acc,
              static_cast<long long>(prompt_length()));
  EXPECT_GE(acc, 0.9) << g.at("cases").dump(1);
}

TEST(NiahTrained, PureSwaScoresNearChanceWhenTheNeedleIsOutsideItsWindow) {
  Model& m = trained("SS");
  const json g = grid(m);
  // No path of kLayers window-W layers reaches from the last prompt token back to any value token.
  i64 min_gap = kMaxLen;
  for (const auto& c : g.at("cases")) {
    const i64 gap = c.at("length").get<i64>() - c.at("value_end").get<i64>();  // tokens after the value
    ASSERT_GT(gap, kLayers * (kWindow - 1)) << c.dump();
    min_gap = std::min(min_gap, gap);
  }
  const double acc = g.at("mean").get<double>();
  std::printf("niah: SS trained %.1f s, accuracy %.3f, needle >= %lld tokens before the end of the prompt\n",
              fx().train_seconds["SS"], acc, static_cast<long long>(min_gap));
  EXPECT_LT(acc, 0.1) << "exact match of a 2-digit number: chance is 1/90";
}

TEST(NiahTrained, FullAttentionCutToOneTokenDropsToChance) {
  Model& m = trained("SF");
  const json base = grid(m);
  const auto full = restricted_layers(m.config(), "full");
  // A span covering the prompt and every generated token restricts nothing: exactly the same grid.
  apply_max_span(m, full, kMaxLen);
  const json same = grid(m);
  apply_max_span(m, full, 1);
  const json cut = grid(m);
  apply_max_span(m, {}, 0);
  EXPECT_EQ(same, base);
  const double acc = cut.at("mean").get<double>();
  std::printf("niah: SF accuracy %.3f, with the full-attention layer cut to span 1 %.3f\n",
              base.at("mean").get<double>(), acc);
  EXPECT_LT(acc, 0.1);
}

TEST(NiahTrained, ValueDigitsOptionSetsTheValueLength) {
  data::ByteTokenizer tok;
  Haystack noise(tok);
  Rng r(3);
  for (int d : {1, 2, 7, 12}) {
    NiahCase c = make_niah_case(tok, noise, 400, 0.5, r, d);
    EXPECT_EQ(static_cast<int>(c.value.size()), d);
    EXPECT_EQ(tok.decode({c.prompt.begin() + c.value_begin, c.prompt.begin() + c.value_end}), " " + c.value);
  }
  EXPECT_THROW(make_niah_case(tok, noise, 400, 0.5, r, 0), Error);
}

TEST(NiahTrained, TokenizerPiecesSpanWordsAndDigitsStaySingle) {
  const data::Tokenizer& tok = *fx().tok;
  // split_by_whitespace off and pieces of up to 32 characters: a 25-character template phrase is one piece.
  EXPECT_EQ(tok.encode(" special magic number for").size(), 1u);
  const auto value = tok.encode(" 42");  // split_digits: " " then one piece a digit
  ASSERT_EQ(value.size(), 3u);
  EXPECT_EQ(tok.decode({value[1]}), "4");
  EXPECT_EQ(tok.decode({value[2]}), "2");
  // Every key (2000 draws of the 32 x 32) leaves a training prompt at least 13 haystack tokens: the needle and
  // question fit 28 tokens (make_niah_case throws when they do not fit the length).
  Rng r(5);
  for (int i = 0; i < 2000; ++i)
    ASSERT_NO_THROW(make_niah_case(tok, fx().hay, prompt_length() - 13, 0.5, r, kValueDigits)) << i;
}
