// Whole-model tests: gradient check, memorisation, config errors, checkpoint round trip, exact resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "model/config.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "ops/precision.h"
#include "testing.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace hlm;
using hlm::testing::close_rel;
using hlm::testing::fp32_depth;
using hlm::testing::fp32_tol;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny(const std::string& pattern, bool f_rope = true, bool qk_norm = false) {
  json j = {{"d_model", 32}, {"n_layers", 4}, {"n_heads", 4}, {"n_kv_heads", 2}, {"head_dim", 8},
            {"d_ff", 48}, {"vocab_size", 37}, {"max_seq_len", 64}, {"pattern", pattern}, {"window", 5},
            {"layer_types", {{"F", {{"rope", f_rope}, {"qk_norm", qk_norm}}}, {"S", {{"rope", true}}}}}};
  return ModelConfig::from_json(j, "test");
}

// Gemma 3's block on the tiny model: QK-norm on both types, a RoPE base of S's own (100, F's 10000), the query
// scale 6^-1/2 (not hd^-1/2), sandwich norms, GeGLU, embeddings scaled by sqrt(32) and tied to the head.
ModelConfig tiny_gemma(const std::string& pattern = "SSSF") {
  json j = tiny(pattern, /*f_rope=*/true, /*qk_norm=*/true).to_json();
  j["layer_types"]["S"]["qk_norm"] = true;
  j["layer_types"]["S"]["rope_theta"] = 100.0;
  for (const char* t : {"F", "S"}) j["layer_types"][t]["query_pre_attn_scalar"] = 6;
  j["mlp_activation"] = "geglu_tanh";
  j["sandwich_norm"] = true;
  j["scale_embeddings"] = true;
  j["tie_embeddings"] = true;
  return ModelConfig::from_json(j, "test gemma");
}

struct TokenBatch {
  i64 B, T;
  std::vector<int32_t> in, tg;
};

TokenBatch random_batch(i64 B, i64 T, i64 V, uint64_t seed) {
  Rng r(seed);
  TokenBatch b{B, T, {}, {}};
  for (i64 i = 0; i < B * T; ++i) {
    b.in.push_back(static_cast<int32_t>(r.below(V)));
    b.tg.push_back(static_cast<int32_t>(r.below(V)));
  }
  return b;
}

// Fixed batches cycling deterministically; its state is the cursor.
class CyclingStream : public BatchStream {
 public:
  CyclingStream(i64 B, i64 T, i64 V, int n) {
    for (int i = 0; i < n; ++i) batches_.push_back(random_batch(B, T, V, 100 + i));
  }
  void next(Batch& b) override {
    const auto& s = batches_[cursor_++ % batches_.size()];
    b.B = s.B;
    b.T = s.T;
    b.inputs = s.in;
    b.targets = s.tg;
    b.doc_start.clear();
  }
  json state() const override { return {{"cursor", cursor_}}; }
  void set_state(const json& s) override { cursor_ = s.at("cursor").get<size_t>(); }

 private:
  std::vector<TokenBatch> batches_;
  size_t cursor_ = 0;
};

}  // namespace

namespace {

// Every parameter tensor's largest-gradient entry, plus one more, against central differences of the loss
// (Richardson-extrapolated from steps h and h/2: O(h^4) truncation error, so fp32 round-off dominates).
// one_pass: the gradient from forward_backward (training's path) instead of forward then backward.
void expect_model_gradient_matches_finite_differences(const ModelConfig& cfg, float h, const std::string& what,
                                                      bool one_pass = false) {
  Model m(cfg);
  m.init(3);
  // Larger weights than init so every path carries signal.
  for (i64 i = 0; i < m.param_floats(); ++i) m.params()[i] *= 3.0f;
  auto b = random_batch(2, 12, cfg.vocab_size, 9);
  m.plan(2, 12);
  i64 n = 0;
  m.zero_grad();
  if (one_pass) {
    m.forward_backward(b.in.data(), b.tg.data(), nullptr, 2, 12, 1.0f / 24, &n);
    EXPECT_EQ(n, 24);  // every target counts, so 1/24 was the mean's scale
  } else {
    m.forward(b.in.data(), b.tg.data(), nullptr, 2, 12, &n);
    m.backward(1.0f / n);
  }
  std::vector<float> g(m.grads(), m.grads() + m.param_floats());
  auto loss = [&]() {
    i64 c = 0;
    return m.forward(b.in.data(), b.tg.data(), nullptr, 2, 12, &c) / c;
  };
  for (const auto& p : m.registry().all()) {
    i64 best = 0;
    for (i64 i = 0; i < p.shape.numel(); ++i)
      if (std::fabs(g[p.offset + i]) > std::fabs(g[p.offset + best])) best = i;
    for (i64 i : {best, p.shape.numel() / 2}) {
      float* w = m.params() + p.offset + i;
      const float old = *w;
      auto central = [&](float step) {
        *w = old + step;
        double lp = loss();
        *w = old - step;
        double lm = loss();
        *w = old;
        return (lp - lm) / (2.0 * step);
      };
      const double fd = (4.0 * central(h / 2) - central(h)) / 3.0;
      const double an = g[p.offset + i];
      EXPECT_NEAR(an, fd, 2e-3 + 0.05 * std::fabs(fd)) << p.name << "[" << i << "] " << what;
    }
  }
}

}  // namespace

TEST(Model, GradientMatchesFiniteDifferencesOnEveryTensorKind) {
  for (bool qk : {false, true})
    expect_model_gradient_matches_finite_differences(tiny("SSSF", /*f_rope=*/false, qk), 1e-2f,
                                                     qk ? "SSSF qk_norm" : "SSSF");
}

// Gemma 3's block: the four norms of a block, GeGLU, the scaled embedding and the tied head (whose gradient adds
// into the embedding's), in both backward paths. h = 3e-4: with the 3x weights the norms of the mixer's and the
// MLP's outputs (1/rms of small vectors) and the embedding scaled by sqrt(32) make the loss curved enough that
// h = 1e-2 misses by up to 10x and h = 1e-3 still by 7% on the embedding (smaller h converges to the analytic value).
TEST(Model, GradientMatchesFiniteDifferencesWithTheGemmaBlock) {
  expect_model_gradient_matches_finite_differences(tiny_gemma(), 3e-4f, "gemma");
  expect_model_gradient_matches_finite_differences(tiny_gemma(), 3e-4f, "gemma one pass", true);
}

namespace {

// Gemma 3's decoder, written out for one row in double from the named tensors (docs/model.md "Gemma 3"):
// x = E[tok] sqrt(D); per layer x += n_pa(attn(n_in(x))), x += n_pf(down(gelu_tanh(gate(h)) up(h))) with
// h = n_pre(x); logits = n_final(x) E^T. attn: per-head RMSNorm of q and k, RoPE (half split) with the layer type's
// theta, causal softmax within the window (S) with scale query_pre_attn_scalar^-1/2, one KV head per H/Hkv heads.
std::vector<double> gemma_reference_logits(const Model& m, const std::vector<int32_t>& tok) {
  const ModelConfig& c = m.config();
  const i64 T = static_cast<i64>(tok.size()), D = c.d_model, F = c.d_ff, V = c.vocab_size;
  auto w = [&](const std::string& name) {
    const int i = m.registry().find(name);
    HLM_CHECK(i >= 0, "the model has no tensor '{}'", name);
    const ParamInfo& p = m.registry().info(i);
    return std::vector<double>(m.params() + p.offset, m.params() + p.offset + p.shape.numel());
  };
  auto rms = [&](std::vector<double>& v, i64 off, i64 n, const std::vector<double>& g) {
    double ss = 0;
    for (i64 i = 0; i < n; ++i) ss += v[off + i] * v[off + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(static_cast<float>(1e-6)));
    for (i64 i = 0; i < n; ++i) v[off + i] *= r * g[i];
  };
  auto matvec = [](const std::vector<double>& W, const std::vector<double>& x, i64 rows, i64 cols) {
    std::vector<double> y(static_cast<size_t>(rows), 0.0);
    for (i64 r = 0; r < rows; ++r)
      for (i64 k = 0; k < cols; ++k) y[r] += W[r * cols + k] * x[k];
    return y;
  };
  const std::vector<double> E = w("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(static_cast<size_t>(T));
  for (i64 t = 0; t < T; ++t) {
    x[t].assign(E.begin() + tok[t] * D, E.begin() + (tok[t] + 1) * D);
    for (double& v : x[t]) v *= std::sqrt(static_cast<double>(D));
  }
  for (i64 l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerTypeOptions& o = c.layer_type(l);
    const i64 H = o.n_heads, Hkv = o.n_kv_heads, hd = o.head_dim;
    const double theta = c.letter(l) == 'S' ? 100.0 : c.rope_theta, scale = 1.0 / std::sqrt(6.0);
    const i64 W = c.letter(l) == 'S' ? o.window : T;
    const auto Wq = w(p + "self_attn.q_proj.weight"), Wk = w(p + "self_attn.k_proj.weight"),
               Wv = w(p + "self_attn.v_proj.weight"), Wo = w(p + "self_attn.o_proj.weight"),
               qn = w(p + "self_attn.q_norm.weight"), kn = w(p + "self_attn.k_norm.weight");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (i64 t = 0; t < T; ++t) {
      std::vector<double> h = x[t];
      rms(h, 0, D, w(p + "input_layernorm.weight"));
      q[t] = matvec(Wq, h, H * hd, D), k[t] = matvec(Wk, h, Hkv * hd, D), v[t] = matvec(Wv, h, Hkv * hd, D);
      auto rotate = [&](std::vector<double>& a, i64 heads) {
        for (i64 g = 0; g < heads; ++g)
          for (i64 i = 0; i < hd / 2; ++i) {
            const double ang = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / hd);
            const double a1 = a[g * hd + i], a2 = a[g * hd + i + hd / 2];
            a[g * hd + i] = a1 * std::cos(ang) - a2 * std::sin(ang);
            a[g * hd + i + hd / 2] = a2 * std::cos(ang) + a1 * std::sin(ang);
          }
      };
      for (i64 g = 0; g < H; ++g) rms(q[t], g * hd, hd, qn);
      for (i64 g = 0; g < Hkv; ++g) rms(k[t], g * hd, hd, kn);
      rotate(q[t], H);
      rotate(k[t], Hkv);
    }
    for (i64 t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(H * hd), 0.0);
      for (i64 h = 0; h < H; ++h) {
        const i64 g = h / (H / Hkv), lo = std::max<i64>(0, t - W + 1);
        std::vector<double> sc;
        double mx = -INFINITY, sum = 0;
        for (i64 j = lo; j <= t; ++j) {
          double d = 0;
          for (i64 i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][g * hd + i];
          sc.push_back(d * scale);
          mx = std::max(mx, sc.back());
        }
        for (double& e : sc) sum += (e = std::exp(e - mx));
        for (i64 j = lo; j <= t; ++j)
          for (i64 i = 0; i < hd; ++i) att[h * hd + i] += sc[j - lo] / sum * v[j][g * hd + i];
      }
      std::vector<double> y = matvec(Wo, att, D, H * hd);
      rms(y, 0, D, w(p + "post_attention_layernorm.weight"));
      for (i64 i = 0; i < D; ++i) x[t][i] += y[i];
    }
    const auto Wg = w(p + "mlp.gate_proj.weight"), Wu = w(p + "mlp.up_proj.weight"), Wd = w(p + "mlp.down_proj.weight");
    for (i64 t = 0; t < T; ++t) {
      std::vector<double> h = x[t];
      rms(h, 0, D, w(p + "pre_feedforward_layernorm.weight"));
      std::vector<double> g = matvec(Wg, h, F, D), u = matvec(Wu, h, F, D);
      for (i64 i = 0; i < F; ++i)
        g[i] = 0.5 * g[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i];
      std::vector<double> y = matvec(Wd, g, D, F);
      rms(y, 0, D, w(p + "post_feedforward_layernorm.weight"));
      for (i64 i = 0; i < D; ++i) x[t][i] += y[i];
    }
  }
  std::vector<double> logits;
  for (i64 t = 0; t < T; ++t) {
    rms(x[t], 0, D, w("model.norm.weight"));
    const std::vector<double> row = matvec(E, x[t], V, D);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

}  // namespace

TEST(Model, GemmaBlockMatchesAPlainReference) {
  for (const char* pattern : {"SSSF", "F"}) {
    Model m(tiny_gemma(pattern));
    m.init(17);
    Rng r(18);
    for (const auto& p : m.registry().all()) {
      float* v = m.params() + p.offset;
      for (i64 i = 0; i < p.shape.numel(); ++i)  // norms spread around 1, the rest larger than init
        v[i] = p.init == Init::Ones ? static_cast<float>(1 + 0.3 * r.normal()) : 3 * v[i];
    }
    EXPECT_EQ(m.registry().find("lm_head.weight"), -1) << "tied: the head is the embedding";
    const i64 T = 13;  // past the window of 5
    auto b = random_batch(1, T, m.config().vocab_size, 19);
    std::vector<float> got(static_cast<size_t>(T * m.config().vocab_size));
    m.forward_logits(b.in.data(), nullptr, 1, T, got.data());
    // fp32 against double: 4 layers of D- and F-long sums, hd-long norms and scores, T-long softmax sums.
    const double depth = fp32_depth({4.0 * (32 + 8 + 8 + T + 32 + 32 + 48 + 32), 32});
    EXPECT_TRUE(close_rel(got, gemma_reference_logits(m, b.in), fp32_tol(depth), pattern));
  }
}

// Every mixer kind below and above another one, so each mixer's dx reaches the layers under it (the mixer
// tests check dx alone). h = 1e-3: with the 3x weights the GDN q/k L2 norm of the first layer is curved enough
// that h = 1e-2 misses by 10-40% on q_proj (smaller h converges to the analytic value).
TEST(Model, GradientMatchesFiniteDifferencesWithEveryMixerKind) {
  for (const char* pattern : {"GMLSF", "FSLMG"}) {
    json j = tiny(pattern).to_json();
    j["n_layers"] = 5;
    j["chunk_size"] = 8;  // T 12: two chunks, the second partial
    expect_model_gradient_matches_finite_differences(ModelConfig::from_json(j, "test"), 1e-3f, pattern);
  }
}

TEST(Model, OnePassForwardBackwardGradientMatchesFiniteDifferences) {
  json j = tiny("GMLSF").to_json();
  j["n_layers"] = 5;
  j["chunk_size"] = 8;
  expect_model_gradient_matches_finite_differences(ModelConfig::from_json(j, "test"), 1e-3f, "one pass", true);
}

// Training's forward_backward against forward then backward: the same loss and gradients up to the LM head's
// summation order (whole rows at once instead of 512-column chunks), with documents and ignored targets, twice
// (the second step reuses the arena), with and without --recompute.
TEST(Model, OnePassForwardBackwardEqualsForwardThenBackward) {
  json hybrid = tiny("GMLSF").to_json(), gemma = tiny_gemma().to_json();  // gemma: the tied head's gradient too
  hybrid["n_layers"] = 5;
  hybrid["chunk_size"] = 8;
  gemma["n_layers"] = 5;
  for (json j : {hybrid, gemma}) {
    SCOPED_TRACE(j.dump());
    j["vocab_size"] = 700;  // two of the separate path's 512-column chunks
    const ModelConfig cfg = ModelConfig::from_json(j, "test");
    const i64 B = 2, T = 40;
    auto b = random_batch(B, T, cfg.vocab_size, 13);
    b.tg[3] = -1, b.tg[50] = -100;  // ignored
    std::vector<int32_t> doc(static_cast<size_t>(B * T));
    for (i64 i = 0; i < B * T; ++i) doc[i] = static_cast<int32_t>(i % T < 17 ? 0 : 17);
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(recompute ? "recompute" : "plain");
      Model two(cfg), one(cfg);
      two.init(5);
      one.init(5);
      one.set_recompute(recompute);
      two.set_recompute(recompute);
      double loss_two = 0, loss_one = 0;
      for (int step = 0; step < 2; ++step) {
        two.zero_grad();
        one.zero_grad();
        i64 n_two = 0, n_one = 0;
        loss_two = two.forward(b.in.data(), b.tg.data(), doc.data(), B, T, &n_two);
        two.backward(1.0f / 78);
        loss_one = one.forward_backward(b.in.data(), b.tg.data(), doc.data(), B, T, 1.0f / 78, &n_one);
        EXPECT_EQ(n_two, 78);
        EXPECT_EQ(n_one, 78);
      }
      // Loss: the log-sum-exp over V in one block or in chunks (depth V each, the row sum N).
      EXPECT_NEAR(loss_one, loss_two, fp32_tol(fp32_depth({2.0 * 700, 2.0 * B * T})) * std::fabs(loss_two));
      // Gradients: the head's dh sums V terms in one product or chunk by chunk; every later stage then rounds its
      // own slightly different inputs, so both paths' whole backward chains count (the model's depth: 5 layers,
      // each a d_ff and a d_model sum, a T-token scan and the norm; the embedding's sum over N).
      const double depth = fp32_depth({2.0 * 700, 2.0 * 5 * (48 + 32 + T + 2), 2.0 * B * T});
      std::vector<float> g_two(two.grads(), two.grads() + two.param_floats());
      std::vector<float> g_one(one.grads(), one.grads() + one.param_floats());
      EXPECT_TRUE(close_rel(g_one, g_two, fp32_tol(depth), "gradients"));
      i64 nonzero = 0;
      for (float g : g_one) nonzero += g != 0.f;
      EXPECT_GT(nonzero, one.param_floats() / 2);
    }
  }
}

// --recompute reruns each block's forward before its backward: the same ops in the same order, so loss and every
// gradient are bitwise those of the plain path (with documents, every mixer kind), in a smaller arena; in fp32 and
// in bf16 (whose kernels are deterministic too). max_arena_ratio: the bound on the recompute arena's size against
// the plain one's (both exact sums of the model's buffers, so the same on every machine).
namespace {
void expect_recompute_bitwise_the_same(ops::Precision precision, double max_arena_ratio, json j = {}) {
  const ops::PrecisionScope scope(precision, /*allow_emulated=*/true);
  if (j.empty()) j = tiny("GMLSF").to_json();
  j["n_layers"] = 5;
  j["chunk_size"] = 8;
  const ModelConfig cfg = ModelConfig::from_json(j, "test");
  const i64 B = 2, T = 40;
  auto b = random_batch(B, T, cfg.vocab_size, 11);
  std::vector<int32_t> doc(static_cast<size_t>(B * T));
  for (i64 i = 0; i < B * T; ++i) doc[i] = static_cast<int32_t>(i % T < 17 ? 0 : 17);  // a second document at 17
  Model plain(cfg), rec(cfg);
  plain.init(5);
  rec.init(5);
  rec.set_recompute(true);
  double loss[2];
  Model* ms[2] = {&plain, &rec};
  for (int k = 0; k < 2; ++k) {
    Model& m = *ms[k];
    m.plan(B, T);
    for (int step = 0; step < 2; ++step) {  // twice: the second step reuses the arena and the mixers' state
      m.zero_grad();
      i64 n = 0;
      loss[k] = m.forward(b.in.data(), b.tg.data(), doc.data(), B, T, &n);
      m.backward(1.0f / static_cast<float>(n));
    }
  }
  EXPECT_EQ(loss[0], loss[1]);
  i64 differ = 0;
  for (i64 i = 0; i < plain.param_floats(); ++i) differ += plain.grads()[i] != rec.grads()[i];
  EXPECT_EQ(differ, 0) << "of " << plain.param_floats() << " gradient entries";
  i64 nonzero = 0;
  for (i64 i = 0; i < plain.param_floats(); ++i) nonzero += plain.grads()[i] != 0.f;
  EXPECT_GT(nonzero, plain.param_floats() / 2);  // a real gradient, not two zero buffers
  // Five blocks' activations against one block plus six residual buffers (the arena throws if it is too small);
  // the backward temporaries and the largest mixer scratch are common to both.
  EXPECT_LT(static_cast<double>(rec.arena_bytes()), max_arena_ratio * static_cast<double>(plain.arena_bytes()));
}
}  // namespace

TEST(Model, RecomputeGivesBitwiseTheSameLossAndGradientsInLessMemory) {
  expect_recompute_bitwise_the_same(ops::Precision::fp32, 0.75);  // 0.67 here
}

TEST(Model, RecomputeGivesBitwiseTheSameLossAndGradientsInBf16) {
  if (!ops::bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  // A bf16 block keeps its gate|up in bf16, half the bytes, so the blocks are a smaller share of the plain arena and
  // recompute saves less of it: 0.77 here.
  expect_recompute_bitwise_the_same(ops::Precision::bf16, 0.8);
}

// The Gemma block keeps two more [N, D] buffers per layer (the mixer's and the MLP's outputs before their norms).
TEST(Model, RecomputeGivesBitwiseTheSameLossAndGradientsWithTheGemmaBlock) {
  expect_recompute_bitwise_the_same(ops::Precision::fp32, 0.75, tiny_gemma().to_json());
  if (ops::bf16_matmul_available())
    expect_recompute_bitwise_the_same(ops::Precision::bf16, 0.8, tiny_gemma().to_json());
}

TEST(Model, MemorisesOneBatch) {
  ModelConfig cfg = tiny("SF");
  Model m(cfg);
  m.init(1);
  CyclingStream s(2, 16, cfg.vocab_size, 1);
  TrainConfig tc;
  tc.steps = 150;
  tc.batch = 2;
  tc.seq_len = 16;
  tc.schedule.lr = 1e-2;
  tc.schedule.warmup = 10;
  tc.schedule.kind = "constant";
  tc.adamw.weight_decay = 0.0;
  tc.eval_every = 0;
  tc.quiet = true;
  Trainer t(m, tc, s, nullptr);
  TrainResult r = t.run();
  EXPECT_GT(r.losses.front(), 3.0);
  EXPECT_LT(r.losses.back(), 0.05) << "first " << r.losses.front();
}

TEST(Model, ResumeContinuesTheExactLossCurve) {
  const fs::path dir = fs::temp_directory_path() / "hlm_test_resume";
  fs::remove_all(dir);
  ModelConfig cfg = tiny("SSF");
  auto make_tc = [&](long steps, const std::string& out) {
    TrainConfig tc;
    tc.steps = steps;
    tc.batch = 2;
    tc.seq_len = 16;
    tc.schedule.lr = 3e-3;
    tc.schedule.warmup = 2;
    tc.eval_every = 0;
    tc.quiet = true;
    tc.out_dir = out;
    return tc;
  };
  std::vector<double> straight;
  {
    Model m(cfg);
    m.init(5);
    CyclingStream s(2, 16, cfg.vocab_size, 7);
    Trainer t(m, make_tc(8, ""), s, nullptr);
    straight = t.run().losses;
  }
  std::vector<double> resumed;
  // The schedule depends on the total step count, so train all 8 steps with a checkpoint every 3 and
  // resume a fresh model from the step-3 checkpoint.
  {
    Model m(cfg);
    m.init(5);
    CyclingStream s(2, 16, cfg.vocab_size, 7);
    TrainConfig tc = make_tc(8, (dir / "run").string());
    tc.ckpt_every = 3;
    tc.keep_checkpoints = 0;
    Trainer t(m, tc, s, nullptr);
    auto full = t.run().losses;
    ASSERT_EQ(full, straight);  // checkpointing does not change the run
  }
  {
    Model m(cfg);
    m.init(999);  // overwritten by resume
    CyclingStream s(2, 16, cfg.vocab_size, 7);
    Trainer t(m, make_tc(8, (dir / "run2").string()), s, nullptr);
    t.resume((dir / "run" / "checkpoints" / "step_00000003").string());
    resumed = t.run().losses;
  }
  ASSERT_EQ(resumed.size(), 5u);
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], straight[i + 3]) << "step " << i + 4;
  fs::remove_all(dir);
}

TEST(Model, CheckpointRoundTripAndCorruptFilesAreErrors) {
  const fs::path dir = fs::temp_directory_path() / "hlm_test_ckpt";
  fs::remove_all(dir);
  ModelConfig cfg = tiny("SF");
  Model a(cfg);
  a.init(11);
  std::string ck = save_checkpoint(dir.string(), 1, a, nullptr, {{"step", 1}});
  EXPECT_EQ(resolve_checkpoint(dir.string()), ck);
  Model b(load_checkpoint_config(ck));
  load_model_params(ck, b);
  for (i64 i = 0; i < a.param_floats(); ++i) ASSERT_EQ(a.params()[i], b.params()[i]);
  // Truncate the model file: loading must fail with the file named.
  const std::string mf = ck + "/model.safetensors";
  fs::resize_file(mf, fs::file_size(mf) / 2);
  try {
    load_model_params(ck, b);
    FAIL() << "truncated checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  // A checkpoint of another config: a shape mismatch names the tensor.
  json other = tiny("SF").to_json();
  other["d_ff"] = 40;
  Model c(ModelConfig::from_json(other, "test"));
  a.init(11);
  std::string ck2 = save_checkpoint((dir / "x").string(), 2, a, nullptr, {{"step", 2}});
  try {
    load_model_params(ck2, c);
    FAIL() << "wrong-config checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers."), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Config, PresetsResolveWithTheirPatterns) {
  EXPECT_EQ(resolve_config("full", "", {}).layer_pattern(), "FFFFFFFF");
  auto s = resolve_config("swa128-nope", "", {});
  EXPECT_EQ(s.layer_pattern(), "SSSFSSSF");
  EXPECT_EQ(s.type('S').window, 128);
  EXPECT_FALSE(s.type('F').rope);
  EXPECT_TRUE(s.type('S').rope);
  EXPECT_TRUE(resolve_config("swa128", "", {}).type('F').rope);
  EXPECT_EQ(resolve_config("swa2048", "", {}).type('S').window, 2048);
  auto o = resolve_config("swa128", "", {"d_model=64", "n_layers=4", "window=32", "layer_types.F.rope=false"});
  EXPECT_EQ(o.d_model, 64);
  EXPECT_EQ(o.type('S').window, 32);
  EXPECT_FALSE(o.type('F').rope);
}

TEST(Config, BadInputIsAnErrorNamingTheField) {
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { resolve_config("nope", "", {}); }, "unknown preset 'nope'");
  expect_error([] { resolve_config("", "", {"pattern=SSXF"}); }, "unknown layer letter 'X'");
  expect_error([] { resolve_config("", "", {"d_modle=64"}); }, "unknown config key 'd_modle'");
  expect_error([] { resolve_config("", "", {"d_model=abc"}); }, "'d_model' must be an integer");
  expect_error([] { resolve_config("", "", {"n_heads=3", "n_kv_heads=2"}); }, "multiple of n_kv_heads");
  expect_error([] { resolve_config("", "", {"layer_types.S.windw=3"}); }, "layer_types.S.windw");
  const fs::path f = fs::temp_directory_path() / "hlm_bad_config.json";
  { std::ofstream(f) << "{\"d_model\": 64,"; }
  expect_error([&] { resolve_config("", f.string(), {}); }, f.string());
  fs::remove(f);
  expect_error([] { Model m(resolve_config("", "", {"max_seq_len=16"})); m.plan(1, 32); }, "max_seq_len");
}

// The Gemma 3 options: written to config.json only when set (older files stay byte-identical), round-trip,
// refused by name when malformed, and the gemma3-small preset resolves to Gemma 3's block.
TEST(Config, GemmaBlockOptionsRoundTripAndAreCheckedByName) {
  const json plain = tiny("SSSF").to_json();
  for (const char* k : {"mlp_activation", "sandwich_norm", "scale_embeddings", "tie_embeddings"})
    EXPECT_FALSE(plain.contains(k)) << k;
  for (const char* t : {"F", "S"})
    for (const char* k : {"rope_theta", "query_pre_attn_scalar"})
      EXPECT_FALSE(plain["layer_types"][t].contains(k)) << k;
  const ModelConfig g = tiny_gemma();
  EXPECT_EQ(ModelConfig::from_json(g.to_json(), "round trip").to_json(), g.to_json());
  EXPECT_EQ(g.mlp_activation, MlpActivation::geglu_tanh);
  EXPECT_EQ(g.type('S').rope_theta, 100.0);
  EXPECT_EQ(g.type('F').rope_theta, 10000.0);  // the model's
  EXPECT_EQ(g.type('F').query_pre_attn_scalar, 6.0);
  EXPECT_EQ(g.embedding_scale(), static_cast<float>(std::sqrt(32.0)));
  EXPECT_EQ(tiny("SSSF").embedding_scale(), 1.f);
  auto expect_error = [](const std::vector<std::string>& sets, const std::string& needle) {
    try {
      resolve_config("", "", sets);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"mlp_activation=relu"}, "'mlp_activation' must be \"swiglu\" or \"geglu_tanh\"");
  expect_error({"sandwich_norm=1"}, "'sandwich_norm' must be true or false");
  expect_error({"pattern=MF", "layer_types.M.rope_theta=5"},
               "'layer_types.M.rope_theta' is only meaningful for F and S");
  expect_error({"layer_types.S.rope_theta=0"}, "layer_types.S: field 'rope_theta' must be > 0");
  expect_error({"layer_types.F.query_pre_attn_scalar=-2"}, "layer_types.F: field 'query_pre_attn_scalar' must be > 0");
  const ModelConfig p = resolve_config("gemma3-small", "", {});
  EXPECT_EQ(p.layer_pattern(), "SSSSSF");
  EXPECT_EQ(p.type('S').rope_theta, 10000.0);
  EXPECT_EQ(p.type('F').rope_theta, 1000000.0);
  EXPECT_TRUE(p.sandwich_norm && p.scale_embeddings && p.tie_embeddings && p.type('S').qk_norm && p.type('F').qk_norm);
  EXPECT_EQ(p.type('F').n_kv_heads, 1);
  // The memory estimate counts the one embedding matrix and the four norms per block.
  const Model m(p);
  EXPECT_EQ(m.registry().find("lm_head.weight"), -1);
  EXPECT_DOUBLE_EQ(estimate_memory(p, MemoryUse{}).weights, 4.0 * static_cast<double>(m.num_params()));
}

// init_scale multiplies exactly the N(0, std) weights (same seed, same draws); norms and custom inits stay.
TEST(Config, InitScaleScalesTheNormalWeightsOnly) {
  ModelConfig a = tiny("SLMGF"), b = a;
  b.init_scale = 3.0;
  Model ma(a), mb(b);
  ma.init(7);
  mb.init(7);
  int normal = 0;
  for (const auto& p : ma.registry().all())
    for (i64 i = 0; i < p.shape.numel(); ++i) {
      const float x = ma.params()[p.offset + i], y = mb.params()[p.offset + i];
      if (p.init == Init::Normal) {
        ASSERT_FLOAT_EQ(y, 3.0f * x) << p.name;
        normal += x != 0;
      } else {
        ASSERT_EQ(y, x) << p.name;
      }
    }
  EXPECT_GT(normal, 1000);
  EXPECT_EQ(ModelConfig::from_json(b.to_json(), "round trip").init_scale, 3.0);
  EXPECT_FALSE(a.to_json().contains("init_scale"));  // default configs are written as before
  EXPECT_THROW(resolve_config("", "", {"init_scale=0"}), Error);
}

// layer_types.{M,G}.a_init_range / dt_init_range set the draws of A_log and dt_bias and nothing else.
TEST(Config, DecayInitRangesSetALogAndDtBiasOnly) {
  ModelConfig a = tiny("SMGF");
  json j = a.to_json();
  EXPECT_FALSE(j["layer_types"]["M"].contains("a_init_range"));  // defaults are not written
  EXPECT_FALSE(j["layer_types"]["G"].contains("dt_init_range"));
  for (const char* t : {"M", "G"}) {
    j["layer_types"][t]["a_init_range"] = {0.5, 0.5};
    j["layer_types"][t]["dt_init_range"] = {0.2, 0.2};
  }
  const ModelConfig b = ModelConfig::from_json(j, "test");
  EXPECT_EQ(b.type('M').a_init_range, (std::array<double, 2>{0.5, 0.5}));
  EXPECT_EQ(ModelConfig::from_json(b.to_json(), "round trip").type('G').dt_init_range, (std::array<double, 2>{0.2, 0.2}));
  EXPECT_EQ(a.type('M').a_init_range, (std::array<double, 2>{1, 16}));  // mamba_ssm
  EXPECT_EQ(a.type('G').a_init_range, (std::array<double, 2>{0, 16}));  // fla GDN
  EXPECT_EQ(a.type('G').dt_init_range, (std::array<double, 2>{1e-3, 0.1}));
  Model ma(a), mb(b);
  ma.init(7);
  mb.init(7);
  const double dt_bias = 0.2 + std::log(-std::expm1(-0.2));  // softplus^-1(0.2)
  int alog = 0, dtb = 0;
  for (const auto& p : ma.registry().all()) {
    const bool is_alog = p.name.ends_with("A_log"), is_dtb = p.name.ends_with("dt_bias");
    for (i64 i = 0; i < p.shape.numel(); ++i) {
      const float x = ma.params()[p.offset + i], y = mb.params()[p.offset + i];
      if (is_alog) {
        EXPECT_FLOAT_EQ(y, std::log(0.5f)) << p.name;
        EXPECT_NE(x, y) << p.name;
        ++alog;
      } else if (is_dtb) {
        EXPECT_NEAR(y, dt_bias, 1e-6) << p.name;
        ++dtb;
      } else {
        ASSERT_EQ(y, x) << p.name;
      }
    }
  }
  EXPECT_EQ(alog, 2 * 32 / 8 + 4);  // one M layer (d_inner / head_dim heads), one G layer (n_heads)
  EXPECT_EQ(dtb, alog);
  for (const char* bad : {"layer_types.S.a_init_range=[1,2]", "layer_types.M.a_init_range=[2,1]",
                          "layer_types.G.dt_init_range=[0,0.1]", "layer_types.M.dt_init_range=0.1",
                          "layer_types.G.a_init_range=[-1,1]"}) {
    try {
      resolve_config("mamba2", "", {bad});
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
      const std::string field = key.substr(key.rfind('.') + 1);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

TEST(Model, FlopsAreCountedPerLayerType) {
  auto full = Model(resolve_config("full", "", {})).flops(1024);
  auto swa = Model(resolve_config("swa128-nope", "", {})).flops(1024);
  // Same matmul weights; attention core differs: full 4*H*hd*mean(t+1) vs SWA band.
  EXPECT_EQ(full.matmul_params, swa.matmul_params);
  EXPECT_DOUBLE_EQ(full.matmul_params, 8 * (4.0 * 256 * 256 + 3.0 * 256 * 768) + 4096.0 * 256);
  const double full_core = 8 * 4.0 * 256 * (1025.0 / 2);
  EXPECT_NEAR(full.forward_per_token - 2 * full.matmul_params, full_core, 1e-6 * full_core);
  EXPECT_LT(swa.forward_per_token, full.forward_per_token);
}

TEST(Model, DecodingEqualsTheFullForwardPastTheWindow) {
  for (const char* pat : {"SSSF", "F", "gemma"}) {
    ModelConfig cfg = std::string(pat) == "gemma" ? tiny_gemma()
                                                  : tiny(pat, /*f_rope=*/std::string(pat) == "F", /*qk_norm=*/true);
    Model m(cfg);
    m.init(21);
    const i64 B = 2, T = 23;  // window is 5: decoding runs far past it
    auto b = random_batch(B, T, cfg.vocab_size, 4);
    std::vector<float> full(static_cast<size_t>(B * T * cfg.vocab_size));
    m.forward_logits(b.in.data(), nullptr, B, T, full.data());
    DecodeState st = m.new_decode_state(B, T);
    // Prefill the first 7 tokens (all logits), then decode one token at a time.
    const i64 P = 7, V = cfg.vocab_size;
    std::vector<int32_t> prompt;
    for (i64 r = 0; r < B; ++r) prompt.insert(prompt.end(), b.in.begin() + r * T, b.in.begin() + r * T + P);
    std::vector<float> pre(static_cast<size_t>(B * P * V)), step(static_cast<size_t>(B * V));
    m.prefill(prompt.data(), B, P, st, nullptr, pre.data());
    std::vector<float> got(full.size()), want(full.size());
    for (i64 r = 0; r < B; ++r)
      for (i64 t = 0; t < P; ++t)
        std::copy(pre.begin() + (r * P + t) * V, pre.begin() + (r * P + t + 1) * V, got.begin() + (r * T + t) * V);
    for (i64 t = P; t < T; ++t) {
      int32_t tok[2] = {b.in[t], b.in[T + t]};
      m.decode_step(tok, st, step.data());
      for (i64 r = 0; r < B; ++r) std::copy(step.begin() + r * V, step.begin() + (r + 1) * V, got.begin() + (r * T + t) * V);
    }
    EXPECT_TRUE(hlm::testing::close_rel(got, full, 1e-5, std::string("decode vs forward ") + pat));
  }
}

