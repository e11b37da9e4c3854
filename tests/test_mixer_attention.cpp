// Softmax attention mixer (src/mixers/attention.*, F = full causal, S = sliding window): a plain token-by-token
// reference of the whole mixer (fused q/k/v projection, per-head QK RMSNorm, RoPE from angles computed on the
// spot, GQA, the causal / windowed softmax, o_proj) in double and complex<double>; exact (complex-step)
// gradients of every parameter and the input with GQA, QK-norm, RoPE or NoPE, a window and packed documents;
// fp32 Richardson finite differences through the mixer itself; step-by-step decoding (the window's ring
// buffer wrapping several times) and prefill in pieces against the reference; RoPE past the table built at
// construction (the forward's grown table and decoding's per-step rows); registry layout, FLOP and arena
// accounting. The Gemma 3 options (a RoPE base of the layer type's own, the query scale from
// query_pre_attn_scalar) run through the same checks as one more layer type.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>

#include "mixer_harness.h"
#include "mixers/attention.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

// One layer of the attention type under test.
struct AttnOpts {
  char letter = 'F';
  i64 D = 16, H = 4, Hkv = 2, hd = 8;
  i64 window = 0;  // S only
  bool rope = true, qk_norm = false;
  i64 max_seq_len = 4096;  // rows of the RoPE table built at construction
  double rope_theta = 0;      // layer_types.<letter>.rope_theta (0: the model's, 10000)
  double query_scalar = 0;    // layer_types.<letter>.query_pre_attn_scalar (0: the scale is hd^-1/2)
  std::string name() const {
    return fmt::format("{} H{}/{} hd{}{}{}{}{}{}", letter, H, Hkv, hd, window > 0 ? fmt::format(" W{}", window) : "",
                       rope ? " RoPE" : " NoPE", qk_norm ? " qk-norm" : "",
                       rope_theta > 0 ? fmt::format(" theta {}", rope_theta) : "",
                       query_scalar > 0 ? fmt::format(" query scalar {}", query_scalar) : "");
  }
};

ModelConfig attn_cfg(const AttnOpts& o) {
  json t = {{"rope", o.rope}, {"n_heads", o.H}, {"n_kv_heads", o.Hkv}, {"head_dim", o.hd}, {"qk_norm", o.qk_norm}};
  if (o.letter == 'S') t["window"] = o.window;
  if (o.rope_theta > 0) t["rope_theta"] = o.rope_theta;
  if (o.query_scalar > 0) t["query_pre_attn_scalar"] = o.query_scalar;
  json j = {{"d_model", o.D},   {"n_layers", 2},          {"n_heads", o.H},      {"n_kv_heads", o.Hkv},
            {"head_dim", o.hd}, {"d_ff", 2 * o.D},        {"vocab_size", 17},    {"max_seq_len", o.max_seq_len},
            {"pattern", std::string(1, o.letter)},       {"layer_types", {{std::string(1, o.letter), t}}}};
  return ModelConfig::from_json(j, "test");
}

inline double re(double v) { return v; }
inline double re(const std::complex<double>& v) { return v.real(); }

// y[B, T, D] of the whole mixer, token by token (S = double for outputs, std::complex<double> for exact
// complex-step gradients), from the named tensors. Token t of row b sees key s iff s <= t, s >= the start of
// its document (ds) and t - s < window (window 0: full). RoPE angles are p * theta^(-2m/hd) at position p = t,
// computed here for any p (no table).
template <typename S>
std::vector<S> reference(const MixerRig& rig, const AttnOpts& o, const std::vector<S>& P, const std::vector<S>& x,
                         i64 B, i64 T, const int32_t* ds) {
  const i64 D = o.D, H = o.H, Hkv = o.Hkv, hd = o.hd, half = hd / 2, group = H / Hkv;
  const S* Wq = P.data() + rig.info("q_proj.weight").offset;
  const S* Wk = P.data() + rig.info("k_proj.weight").offset;
  const S* Wv = P.data() + rig.info("v_proj.weight").offset;
  const S* Wo = P.data() + rig.info("o_proj.weight").offset;
  const S* wqn = o.qk_norm ? P.data() + rig.info("q_norm.weight").offset : nullptr;
  const S* wkn = o.qk_norm ? P.data() + rig.info("k_norm.weight").offset : nullptr;
  const double theta = o.rope_theta > 0 ? o.rope_theta : rig.cfg.rope_theta;
  const double scale = 1.0 / std::sqrt(o.query_scalar > 0 ? o.query_scalar : static_cast<double>(hd));
  auto lin = [&](const S* W, i64 rows, const S* xr, S* out) {
    for (i64 r = 0; r < rows; ++r) {
      S acc(0);
      for (i64 d = 0; d < D; ++d) acc += W[r * D + d] * xr[d];
      out[r] = acc;
    }
  };
  // One head's vector at position p: RMSNorm with weight w (eps 1e-6, as the mixer's), then the rotation.
  auto norm_rope = [&](S* v, const S* w, i64 p) {
    if (w) {
      S ss(0);
      for (i64 i = 0; i < hd; ++i) ss += v[i] * v[i];
      const S r = 1.0 / std::sqrt(ss / static_cast<double>(hd) + static_cast<double>(1e-6f));
      for (i64 i = 0; i < hd; ++i) v[i] = v[i] * r * w[i];
    }
    if (!o.rope) return;
    for (i64 m = 0; m < half; ++m) {
      const double a = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(m) / static_cast<double>(hd));
      const S x1 = v[m], x2 = v[m + half];
      v[m] = x1 * std::cos(a) - x2 * std::sin(a);
      v[m + half] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  };
  std::vector<S> y(static_cast<size_t>(B * T * D));
  std::vector<S> q(static_cast<size_t>(T * H * hd)), k(static_cast<size_t>(T * Hkv * hd)), v(k.size());
  std::vector<S> out(static_cast<size_t>(H * hd)), p(static_cast<size_t>(T));
  for (i64 b = 0; b < B; ++b) {
    for (i64 t = 0; t < T; ++t) {
      const S* xr = x.data() + (b * T + t) * D;
      lin(Wq, H * hd, xr, q.data() + t * H * hd);
      lin(Wk, Hkv * hd, xr, k.data() + t * Hkv * hd);
      lin(Wv, Hkv * hd, xr, v.data() + t * Hkv * hd);
      for (i64 h = 0; h < H; ++h) norm_rope(q.data() + (t * H + h) * hd, wqn, t);
      for (i64 g = 0; g < Hkv; ++g) norm_rope(k.data() + (t * Hkv + g) * hd, wkn, t);
    }
    for (i64 t = 0; t < T; ++t) {
      i64 lo = ds ? ds[b * T + t] : 0;
      if (o.window > 0) lo = std::max(lo, t - o.window + 1);
      for (i64 h = 0; h < H; ++h) {
        const S* qh = q.data() + (t * H + h) * hd;
        const i64 g = h / group;
        double mx = -INFINITY;  // any constant works; the real part's max keeps exp in range
        for (i64 s = lo; s <= t; ++s) {
          S dot(0);
          for (i64 i = 0; i < hd; ++i) dot += qh[i] * k[(s * Hkv + g) * hd + i];
          p[s] = dot * scale;
          mx = std::max(mx, re(p[s]));
        }
        S sum(0);
        for (i64 s = lo; s <= t; ++s) p[s] = std::exp(p[s] - mx), sum += p[s];
        S* oh = out.data() + h * hd;
        for (i64 i = 0; i < hd; ++i) {
          S acc(0);
          for (i64 s = lo; s <= t; ++s) acc += p[s] * v[(s * Hkv + g) * hd + i];
          oh[i] = acc / sum;
        }
      }
      for (i64 d = 0; d < D; ++d) {
        S acc(0);
        for (i64 i = 0; i < H * hd; ++i) acc += Wo[d * H * hd + i] * out[i];
        y[(b * T + t) * D + d] = acc;
      }
    }
  }
  return y;
}

std::vector<double> ref_d(const MixerRig& rig, const AttnOpts& o, const std::vector<float>& x, i64 B, i64 T,
                          const int32_t* ds = nullptr) {
  return reference<double>(rig, o, rig.params_d(), to_double(x), B, T, ds);
}

// The norm weights start at 1 (Init::Ones): spread them so a wrong weight index shows.
void perturb_norms(MixerRig& rig, const AttnOpts& o, uint64_t seed) {
  if (!o.qk_norm) return;
  Rng r(seed);
  for (const char* name : {"q_norm.weight", "k_norm.weight"})
    for (i64 i = 0; i < o.hd; ++i) rig.param(name)[i] = static_cast<float>(1.0 + 0.5 * r.normal());
}

// fp32 error depth of the mixer's forward (testing.h fp32_tol, docs/testing.md): the q/k/v projection over D,
// the QK RMSNorm over hd, RoPE (two products per rotated entry), the scores over hd, exp, the softmax sum and
// the P V sum over the `ctx` visible keys, o_proj over H*hd. A score's absolute error moves its probability by
// that error times the probability, so a score's relative error is amplified by kappa = |score|: the scores'
// stages (projection, norm, rotation, dot product) count kappa^2 times, with kappa = 4: the RMS |score| of
// these tests is 0.7-1.4, the largest 2.4-4.4 (the packed test: 9, in 1.7% of its scores above 4).
constexpr double kScoreKappa = 4;
double attention_depth(const AttnOpts& o, i64 ctx) {
  const double k2 = kScoreKappa * kScoreKappa;
  return fp32_depth({k2 * double(o.D), k2 * double(o.hd), k2 * 2, k2 * double(o.hd), 1, double(ctx), double(ctx),
                     double(o.H * o.hd)});
}
i64 visible(const AttnOpts& o, i64 T) { return o.window > 0 ? std::min(o.window, T) : T; }

// The layer types under test: full attention with GQA, RoPE and QK-norm; full attention, one KV head (MQA),
// NoPE; sliding window with GQA, RoPE and QK-norm; sliding window, multi-head (Hkv = H), NoPE; Gemma 3's sliding
// layer: MQA, QK-norm, a RoPE base of its own and the scale query_pre_attn_scalar^-1/2 (6, not hd).
std::vector<AttnOpts> layer_types() {
  return {
      {'F', 16, 4, 2, 8, 0, true, true},
      {'F', 16, 4, 1, 8, 0, false, false},
      {'S', 16, 4, 2, 8, 5, true, true},
      {'S', 16, 2, 2, 8, 7, false, false},
      {'S', 16, 4, 1, 8, 5, true, true, 4096, 500.0, 6.0},
  };
}

}  // namespace

TEST(AttentionMixer, RegistersNamesShapesAndInit) {
  AttnOpts o{'S', 16, 4, 2, 8, 5, true, true};
  MixerRig rig(attn_cfg(o), 0);
  const auto& q = rig.info("q_proj.weight");
  EXPECT_EQ(q.name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape.numel(), 4 * 8 * 16);
  // q | k | v adjacent: the fused projection reads them as one [(H + 2 Hkv) hd, D] matrix.
  EXPECT_EQ(rig.info("k_proj.weight").offset, q.offset + 4 * 8 * 16);
  EXPECT_EQ(rig.info("v_proj.weight").offset, q.offset + (4 + 2) * 8 * 16);
  EXPECT_EQ(rig.info("o_proj.weight").shape.numel(), 16 * 4 * 8);
  EXPECT_FALSE(rig.info("q_norm.weight").decay);
  EXPECT_FALSE(rig.info("k_norm.weight").decay);
  EXPECT_TRUE(rig.info("o_proj.weight").decay);
  rig.init(1);
  for (i64 i = 0; i < 8; ++i) EXPECT_EQ(rig.param("q_norm.weight")[i], 1.f);
  EXPECT_EQ(dynamic_cast<const AttentionMixer&>(*rig.m).window(), 5);
  MixerRig plain(attn_cfg({'F', 16, 4, 4, 8, 0, false, false}), 0);
  EXPECT_THROW(plain.info("q_norm.weight"), std::runtime_error);
  EXPECT_EQ(dynamic_cast<const AttentionMixer&>(*plain.m).window(), 0);
}

TEST(AttentionMixer, ForwardMatchesTokenByTokenReference) {
  const i64 B = 2, T = 37;
  const auto ds = packed_doc_start(T, {{0, 9, 10, 30}, {0}});
  for (const AttnOpts& o : layer_types()) {
    MixerRig rig(attn_cfg(o), 0);
    rig.init(1, 10.0);
    perturb_norms(rig, o, 2);
    const auto x = randn(static_cast<size_t>(B * T * o.D), 3);
    const double tol = fp32_tol(attention_depth(o, visible(o, T)));
    EXPECT_TRUE(close_rel(rig.forward(x, B, T), ref_d(rig, o, x, B, T), tol, o.name()));
    EXPECT_TRUE(close_rel(rig.forward(x, B, T, ds.data()), ref_d(rig, o, x, B, T, ds.data()), tol, o.name() + " packed"));
  }
}

TEST(AttentionMixer, GradientsMatchExactReferenceGradients) {
  const i64 B = 2, T = 9;
  const auto ds = packed_doc_start(T, {{0, 4}, {0}});
  for (AttnOpts o : layer_types()) {
    o.D = 8, o.hd = 4, o.window = std::min<i64>(o.window, 3);  // small: one reference run per entry
    MixerRig rig(attn_cfg(o), 0);
    rig.init(4, 10.0);
    perturb_norms(rig, o, 5);
    const auto x = randn(static_cast<size_t>(B * T * o.D), 6);
    // Forward and backward chains plus the longest gradient sum (weights: B*T tokens).
    const double tol = fp32_tol(2 * attention_depth(o, visible(o, T)) + double(B * T));
    for (const int32_t* d : {static_cast<const int32_t*>(nullptr), ds.data()}) {
      const std::string tag = o.name() + (d ? " packed" : "");
      const double worst = check_grads_vs_reference(
          rig, x, B, T, d,
          [&](const std::vector<cplx>& P, const std::vector<cplx>& xc) { return reference(rig, o, P, xc, B, T, d); },
          tol, tag);
      RecordProperty("worst_rel_error_" + tag, fmt::format("{:.3g}", worst));
    }
    check_grads_fp32_richardson(rig, x, B, T, ds.data(), o.name());
  }
}

TEST(AttentionMixer, StepDecodeMatchesReferenceThroughTheWindowRing) {
  // T = 40 tokens through a window of 5 or 7: the ring buffer wraps 5-8 times; full attention keeps them all.
  const i64 B = 2, T = 40;
  for (const AttnOpts& o : layer_types()) {
    MixerRig rig(attn_cfg(o), 0);
    rig.init(7, 10.0);
    perturb_norms(rig, o, 8);
    const auto x = randn(static_cast<size_t>(B * T * o.D), 9);
    const auto want = ref_d(rig, o, x, B, T);
    const double tol = fp32_tol(attention_depth(o, visible(o, T)));
    EXPECT_TRUE(close_rel(rig.decode(x, B, T), want, tol, o.name() + " decode"));
    // The cache holds W entries per row and KV head (the ring), or the whole context.
    const i64 kv = B * visible(o, T) * o.Hkv * o.hd;
    auto st = rig.m->new_state(B, T);
    EXPECT_EQ(st->bytes(), static_cast<i64>(2 * kv * sizeof(float)));
    // Prefill in pieces from a non-empty cache (on and off the ring's wrap points), then decoding.
    std::vector<float> got = nan_vec(x.size());
    rig.prefill(x, got, B, T, *st, 0, 3);
    rig.prefill(x, got, B, T, *st, 3, 17);
    rig.prefill(x, got, B, T, *st, 17, 18);
    const auto tail = rig.decode(x, B, T, st.get(), 18, 30);
    for (i64 b = 0; b < B; ++b)
      std::copy(tail.begin() + (b * T + 18) * o.D, tail.begin() + (b * T + 30) * o.D, got.begin() + (b * T + 18) * o.D);
    rig.prefill(x, got, B, T, *st, 30, T);
    EXPECT_TRUE(close_rel(got, want, tol, o.name() + " prefill + step"));
  }
}

TEST(AttentionMixer, RopePastTheTableMatchesTheReference) {
  // The table is built for 16 positions. The forward grows it to the batch's length; decoding past it rotates
  // by rows computed for the step's position; prefill past it by rows for the piece's positions.
  const i64 B = 1, T = 45;
  for (AttnOpts o : layer_types()) {
    if (!o.rope) continue;
    o.max_seq_len = 16;
    const auto x = randn(static_cast<size_t>(B * T * o.D), 10);
    const double tol = fp32_tol(attention_depth(o, visible(o, T)));
    MixerRig dec(attn_cfg(o), 0);  // never runs a forward: its table keeps 16 rows
    dec.init(11, 10.0);
    perturb_norms(dec, o, 12);
    const auto want = ref_d(dec, o, x, B, T);
    EXPECT_TRUE(close_rel(dec.decode(x, B, T), want, tol, o.name() + " decode past the table"));
    auto st = dec.m->new_state(B, T);
    std::vector<float> got = nan_vec(x.size());
    dec.prefill(x, got, B, T, *st, 0, 10);
    dec.prefill(x, got, B, T, *st, 10, 30);  // crosses position 16
    dec.prefill(x, got, B, T, *st, 30, T);   // entirely past it
    EXPECT_TRUE(close_rel(got, want, tol, o.name() + " prefill past the table"));
    EXPECT_TRUE(close_rel(dec.forward(x, B, T), want, tol, o.name() + " forward past the table"));
  }
}

TEST(AttentionMixer, Fp32GradientsMatchRichardsonFiniteDifferencesAtModelSize) {
  const i64 B = 2, T = 70;  // more than one 64-row tile of the kernel
  AttnOpts o{'S', 32, 4, 2, 16, 40, true, true};
  MixerRig rig(attn_cfg(o), 0);
  rig.init(13, 5.0);
  perturb_norms(rig, o, 14);
  check_grads_fp32_richardson(rig, randn(static_cast<size_t>(B * T * o.D), 15), B, T, nullptr, o.name());
}

TEST(AttentionMixer, PackedDocumentsEqualSeparateRuns) {
  const i64 B = 2, T = 90;
  const std::vector<std::vector<i64>> starts = {{0, 1, 40, 75}, {0, 66}};
  for (const AttnOpts& o : layer_types()) {
    MixerRig rig(attn_cfg(o), 0);
    rig.init(16, 10.0);
    perturb_norms(rig, o, 17);
    const auto x = randn(static_cast<size_t>(B * T * o.D), 18), dy = randn(x.size(), 19);
    // Two fp32 runs of forward + backward (each side: both chains and the B*T gradient sums).
    const auto y = expect_packed_equals_separate(rig, x, dy, B, T, o.D, starts,
                                                 fp32_tol(2 * (2 * attention_depth(o, visible(o, T)) + B * T)));
    const auto ds = packed_doc_start(T, starts);
    EXPECT_TRUE(close_rel(y, ref_d(rig, o, x, B, T, ds.data()), fp32_tol(attention_depth(o, visible(o, T))),
                          o.name() + " packed vs reference"));
  }
}

TEST(AttentionMixer, FlopsAndArenaBounds) {
  AttnOpts o{'S', 64, 4, 2, 16, 32, true, true};
  MixerRig rig(attn_cfg(o), 0);
  const FlopCount f = rig.m->flops_per_token(128);
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * ((4 + 2 * 2) * 16 * 64.0 + 64.0 * 4 * 16));
  // Mean visible context over 128 positions with W = 32: (1 + .. + 32 + 96 * 32) / 128.
  EXPECT_DOUBLE_EQ(f.core, 4.0 * 4 * 16 * ((32.0 * 33 / 2 + 96 * 32) / 128));
  rig.init(20);
  const i64 B = 3, T = 29;
  const auto ds = packed_doc_start(T, {{0, 10}, {0}, {0, 1, 2, 28}});
  // Three prefill calls of 29 tokens: the third stages a full window (W - 1 cached keys) before its own.
  expect_arena_use_exact(rig, randn(static_cast<size_t>(B * T * o.D), 21), B, T, ds.data(), 3);
  // Full attention without QK norm: no pre-norm copy, and prefill stages nothing (the cache is in order).
  AttnOpts full{'F', 64, 4, 2, 16, 0, false, false};
  MixerRig frig(attn_cfg(full), 0);
  frig.init(22);
  expect_arena_use_exact(frig, randn(static_cast<size_t>(B * T * full.D), 23), B, T, ds.data());
}
