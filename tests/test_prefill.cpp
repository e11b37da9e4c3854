// Chunked prefill from any cache state (infer/, Model::prefill, every mixer's prefill): prompts prefilled in
// pieces (that do not divide the prompt, shorter and longer than the SWA window, one token, mixed) and then
// decoded token by token give the logits of one full forward, for F, S far past its window and the paper's
// hybrids (SF, SSSF with NoPE F, LF, MF, GF) and Gemma 3's block (SSSF), batch 2, past the training length (RoPE
// rows computed for the positions at hand); the generator's output does not depend on the piece size; and the
// prefill arena and decode state of an S-only model do not grow with the prompt.
// Cost: ~1 s in Release, one OpenMP thread.
#include <gtest/gtest.h>
#include <omp.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "infer/generator.h"
#include "model/model.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

// One OpenMP thread for the duration of a test (tiny models: barriers cost more than the work).
struct OneThread {
  int old = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(old); }
};

// Tiny model: window 5 (so pieces of 3, 7, 9 are below and above it), recurrent chunk 8 (pieces cross it).
ModelConfig tiny(const std::string& pattern, bool f_rope = true) {
  nlohmann::json j = {{"d_model", 32},   {"n_layers", 4},      {"n_heads", 4},         {"n_kv_heads", 2},
                      {"head_dim", 8},   {"d_ff", 48},         {"vocab_size", 37},     {"max_seq_len", 64},
                      {"pattern", pattern}, {"window", 5},     {"chunk_size", 8},      {"mamba_d_state", 8},
                      {"mamba_expand", 2},
                      {"layer_types", {{"F", {{"rope", f_rope}, {"qk_norm", true}}}, {"S", {{"rope", true}}}}}};
  return ModelConfig::from_json(j, "test");
}

// Gemma 3's block on a tiny config: QK-norm everywhere, S's own RoPE base, the query scale 6^-1/2, sandwich
// norms, GeGLU, scaled and tied embeddings.
ModelConfig with_gemma_block(const ModelConfig& c) {
  nlohmann::json j = c.to_json();
  for (const char* t : {"F", "S"})
    if (j["layer_types"].contains(t)) {
      j["layer_types"][t]["qk_norm"] = true;
      j["layer_types"][t]["query_pre_attn_scalar"] = 6;
    }
  j["layer_types"]["S"]["rope_theta"] = 100.0;
  j["mlp_activation"] = "geglu_tanh";
  j["sandwich_norm"] = true;
  j["scale_embeddings"] = true;
  j["tie_embeddings"] = true;
  return ModelConfig::from_json(j, "test gemma");
}

std::vector<int32_t> tokens(i64 n, i64 V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(r.below(V));
  return t;
}

// Row b's tokens [t0, t1) of a [B, T] batch, as a [B, t1 - t0] batch.
std::vector<int32_t> cols(const std::vector<int32_t>& x, i64 B, i64 T, i64 t0, i64 t1) {
  std::vector<int32_t> out;
  for (i64 b = 0; b < B; ++b) out.insert(out.end(), x.begin() + b * T + t0, x.begin() + b * T + t1);
  return out;
}

}  // namespace

TEST(Prefill, ChunkedPrefillThenDecodeEqualsTheFullForward) {
  OneThread one;
  struct Arch {
    const char* pattern;
    bool f_rope;
    bool gemma = false;
  };
  const Arch archs[] = {{"F", true}, {"S", true}, {"SF", true}, {"SSSF", false}, {"LF", true}, {"MF", true},
                        {"GF", true}, {"SSSF", true, true}};
  // Piece schedules (cycled until the prompt is consumed): not dividing the prompt, below and above the
  // window, one token, and a mix of all.
  const std::vector<std::vector<i64>> schedules = {{7}, {3}, {9}, {1}, {2, 11, 1, 5}, {40}};
  const i64 B = 2, T = 40;
  for (const Arch& a : archs) {
    ModelConfig cfg = a.gemma ? with_gemma_block(tiny(a.pattern, a.f_rope)) : tiny(a.pattern, a.f_rope);
    cfg.max_seq_len = 16;  // positions 16.. take RoPE rows from past the training-length table
    const i64 V = cfg.vocab_size;
    Model m(cfg);
    m.init(5);
    auto x = tokens(B * T, V, 17);
    std::vector<float> full = nan_vec(static_cast<size_t>(B * T * V));
    m.forward_logits(x.data(), nullptr, B, T, full.data());
    Model dec(cfg);  // a twin that never ran a forward past max_seq_len (which grows the RoPE table)
    dec.init(5);
    for (const auto& sched : schedules) {
      for (i64 P : {i64{T}, i64{T - 8}}) {  // all prefilled, or the last 8 decoded
        DecodeState st = dec.new_decode_state(B, T);
        std::vector<float> got = nan_vec(full.size());
        i64 t0 = 0;
        for (size_t i = 0; t0 < P; ++i) {
          const i64 n = std::min(sched[i % sched.size()], P - t0);
          auto piece = cols(x, B, T, t0, t0 + n);
          std::vector<float> lg = nan_vec(static_cast<size_t>(B * n * V)), last = nan_vec(static_cast<size_t>(B * V));
          dec.prefill(piece.data(), B, n, st, last.data(), lg.data());
          for (i64 b = 0; b < B; ++b) {
            std::copy(lg.begin() + b * n * V, lg.begin() + (b + 1) * n * V, got.begin() + (b * T + t0) * V);
            // A one-row product against a row of the piece's product: equal up to the summation order.
            std::vector<float> row(lg.begin() + ((b + 1) * n - 1) * V, lg.begin() + (b + 1) * n * V);
            ASSERT_TRUE(close_rel(std::vector<float>(last.begin() + b * V, last.begin() + (b + 1) * V), row, 1e-6,
                                  "last logits"));
          }
          t0 += n;
        }
        for (i64 t = P; t < T; ++t) {
          int32_t tok[B] = {x[t], x[T + t]};
          std::vector<float> lg = nan_vec(static_cast<size_t>(B * V));
          dec.decode_step(tok, st, lg.data());
          for (i64 b = 0; b < B; ++b) std::copy(lg.begin() + b * V, lg.begin() + (b + 1) * V, got.begin() + (b * T + t) * V);
        }
        EXPECT_EQ(st.pos, T);
        std::string what =
            std::string(a.pattern) + (a.f_rope ? "" : " NoPE F") + (a.gemma ? " gemma" : "") + " schedule";
        for (i64 n : sched) {
          what += ' ';
          what += std::to_string(n);
        }
        what += " prefill " + std::to_string(P);
        EXPECT_TRUE(close_rel(got, full, 1e-5, what));
      }
    }
  }
}

TEST(Prefill, GeneratedTokensDoNotDependOnThePieceSize) {
  OneThread one;
  ModelConfig cfg = tiny("SSSF", false);
  cfg.max_seq_len = 512;
  Model m(cfg);
  m.init(9);
  auto prompt = tokens(300, cfg.vocab_size, 3);
  GenerateConfig g;
  g.max_new_tokens = 12;
  g.prefill_chunk = 0;  // whole prompt
  const auto want = generate(m, prompt, g);
  ASSERT_EQ(want.size(), 12u);
  for (i64 chunk : {1, 5, 64, 100, 1000}) {
    g.prefill_chunk = chunk;
    EXPECT_EQ(generate(m, prompt, g), want) << "prefill_chunk " << chunk;
  }
  EXPECT_GT(GenerateConfig{}.prefill_chunk, 0) << "the default prefills in pieces";
}

// The prefill arena is sized for the piece and the SWA ring buffer for the window: prompts 8x longer use
// the same memory. (A full-attention model's KV cache does grow: checked as the contrast.)
TEST(Prefill, MemoryOfAnSwaModelDoesNotGrowWithThePrompt) {
  OneThread one;
  struct Use {
    i64 arena, high_water, state;
  };
  auto run = [](const char* pattern, i64 P, i64 chunk) {
    ModelConfig cfg = tiny(pattern);
    cfg.max_seq_len = 64;  // prompts go past it: decoding is not limited by the training length
    Model m(cfg);
    m.init(1);
    GenerateConfig g;
    g.max_new_tokens = 2;
    g.prefill_chunk = chunk;
    GenerateStats s;
    generate(m, tokens(P, cfg.vocab_size, 2), g, &s);
    return Use{m.infer_arena_bytes(), m.infer_arena_high_water(), s.state_bytes};
  };
  const Use a = run("S", 256, 64), b = run("S", 2048, 64);
  EXPECT_EQ(a.arena, b.arena);
  EXPECT_EQ(a.high_water, b.high_water);
  EXPECT_EQ(a.state, b.state);
  EXPECT_GT(a.high_water, 0);
  EXPECT_LE(a.high_water, a.arena);
  // Contrasts: the whole prompt at once needs activations for all of it; a full KV cache grows.
  EXPECT_GT(run("S", 2048, 0).high_water, 4 * b.high_water);
  EXPECT_GT(run("F", 2048, 64).state, 4 * run("F", 256, 64).state);
}
