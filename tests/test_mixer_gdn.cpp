// Gated DeltaNet mixer (src/mixers/gdn.*): a plain token-by-token reference of the whole mixer (projections,
// three causal convs + SiLU, L2 norms, gates, delta rule, per-head RMSNorm * silu gate, o_proj) in double and
// complex<double>; exact (complex-step) gradients of every parameter and the input with the gates at their
// extremes, fp32 Richardson finite differences through the mixer itself, packed documents == separate runs
// (saved and recomputed chunk states), decode and prefill past the chunk size, the probe's max span, init,
// registry layout, FLOP and arena accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>

#include "mixer_harness.h"
#include "mixers/gdn.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

ModelConfig gdn_cfg(i64 D, i64 H, i64 K, i64 chunk, i64 n_layers = 4) {
  json j = {{"d_model", D},      {"n_layers", n_layers}, {"n_heads", 2},     {"n_kv_heads", 2},
            {"head_dim", 8},     {"d_ff", 2 * D},        {"vocab_size", 17}, {"max_seq_len", 4096},
            {"pattern", "G"},    {"chunk_size", chunk},
            {"layer_types", {{"G", {{"n_heads", H}, {"head_dim", K}}}}}};
  return ModelConfig::from_json(j, "test");
}

inline double re(double v) { return v; }
inline double re(const std::complex<double>& v) { return v.real(); }

template <typename S>
S sigm(S v) {
  return 1.0 / (1.0 + std::exp(-v));
}
template <typename S>
S silu(S v) {
  return v * sigm(v);
}
template <typename S>
S softplus(S v) {
  return re(v) > 20 ? v : std::log(1.0 + std::exp(v));
}

// y[B, T, D] of the whole mixer, token by token, from the named tensors (S = double for outputs,
// std::complex<double> for exact complex-step gradients). A document start (or, with span > 0, every
// multiple of span) clears the delta-rule state and hides earlier tokens from the convolutions.
template <typename S>
std::vector<S> reference(const MixerRig& rig, const std::vector<S>& Pv, const std::vector<S>& x, i64 B, i64 T,
                         const int32_t* ds, i64 span) {
  const auto& mm = dynamic_cast<const GatedDeltaNetMixer&>(*rig.m);
  const i64 D = rig.D, H = mm.n_heads(), K = mm.head_dim(), HK = H * K;
  auto par = [&](const char* name) { return Pv.data() + rig.info(name).offset; };
  const S *Wq = par("q_proj.weight"), *Wk = par("k_proj.weight"), *Wv = par("v_proj.weight");
  const S *Wg = par("g_proj.weight"), *Wb = par("b_proj.weight"), *Wa = par("a_proj.weight");
  const S *cq = par("q_conv1d.weight"), *ck = par("k_conv1d.weight"), *cv = par("v_conv1d.weight");
  const S *alog = par("A_log"), *dtb = par("dt_bias"), *wn = par("o_norm.weight"), *Wo = par("o_proj.weight");
  auto lin = [&](const S* W, i64 rows, const S* xr, S* out) {
    for (i64 row = 0; row < rows; ++row) {
      S acc = 0;
      for (i64 d = 0; d < D; ++d) acc += W[row * D + d] * xr[d];
      out[row] = acc;
    }
  };
  const i64 Wd = 4 * HK + 2 * H;  // per token: q | k | v (before the convs) | gp | b | a
  std::vector<S> y(static_cast<size_t>(B * T * D)), pr(static_cast<size_t>(T * Wd));
  std::vector<S> St(static_cast<size_t>(H * K * K)), q(HK), k(HK), v(HK), z(HK), o(K), r(K);
  for (i64 b = 0; b < B; ++b) {
    for (i64 t = 0; t < T; ++t) {
      const S* xr = x.data() + (b * T + t) * D;
      S* p = pr.data() + t * Wd;
      lin(Wq, HK, xr, p), lin(Wk, HK, xr, p + HK), lin(Wv, HK, xr, p + 2 * HK), lin(Wg, HK, xr, p + 3 * HK);
      lin(Wb, H, xr, p + 4 * HK), lin(Wa, H, xr, p + 4 * HK + H);
    }
    std::fill(St.begin(), St.end(), S(0));  // [H, K(k), K(v)]
    i64 seg = 0;
    for (i64 t = 0; t < T; ++t) {
      if ((ds && t > 0 && ds[b * T + t] == t) || (span > 0 && t > 0 && t % span == 0)) {
        seg = t;
        std::fill(St.begin(), St.end(), S(0));
      }
      auto conv = [&](i64 col, const S* w, i64 c) {
        S acc = 0;
        for (i64 j = 0; j < 4; ++j) {
          const i64 s = t - 3 + j;
          if (s >= seg) acc += w[c * 4 + j] * pr[s * Wd + col + c];
        }
        return silu(acc);
      };
      for (i64 c = 0; c < HK; ++c) q[c] = conv(0, cq, c), k[c] = conv(HK, ck, c), v[c] = conv(2 * HK, cv, c);
      const S* gp = pr.data() + t * Wd + 3 * HK;
      const S* bb = gp + HK;
      const S* aa = bb + H;
      for (i64 h = 0; h < H; ++h) {
        S sq = 0, sk = 0;
        for (i64 i = 0; i < K; ++i) sq += q[h * K + i] * q[h * K + i], sk += k[h * K + i] * k[h * K + i];
        const S nq = 1.0 / std::sqrt(sq + 1e-6) / std::sqrt(double(K)), nk = 1.0 / std::sqrt(sk + 1e-6);
        S* qh = q.data() + h * K;
        S* kh = k.data() + h * K;
        for (i64 i = 0; i < K; ++i) qh[i] *= nq, kh[i] *= nk;
        const S beta = sigm(bb[h]);
        const S alpha = std::exp(-std::exp(alog[h]) * softplus(aa[h] + dtb[h]));
        S* Sh = St.data() + h * K * K;
        std::fill(o.begin(), o.end(), S(0));
        std::fill(r.begin(), r.end(), S(0));
        for (i64 i = 0; i < K * K; ++i) Sh[i] *= alpha;  // decay before the delta read
        for (i64 i = 0; i < K; ++i)
          for (i64 j = 0; j < K; ++j) r[j] += Sh[i * K + j] * kh[i];
        for (i64 i = 0; i < K; ++i)
          for (i64 j = 0; j < K; ++j) Sh[i * K + j] += kh[i] * beta * (v[h * K + j] - r[j]);
        for (i64 i = 0; i < K; ++i)
          for (i64 j = 0; j < K; ++j) o[j] += Sh[i * K + j] * qh[i];  // the updated state
        S ms = 0;
        for (i64 j = 0; j < K; ++j) ms += o[j] * o[j];
        const S rs = 1.0 / std::sqrt(ms / double(K) + 1e-5);
        for (i64 j = 0; j < K; ++j) z[h * K + j] = o[j] * rs * wn[j] * silu(gp[h * K + j]);
      }
      for (i64 d = 0; d < D; ++d) {
        S acc = 0;
        for (i64 c = 0; c < HK; ++c) acc += Wo[d * HK + c] * z[c];
        y[(b * T + t) * D + d] = acc;
      }
    }
  }
  return y;
}

std::vector<double> ref_d(const MixerRig& rig, const std::vector<float>& x, i64 B, i64 T, const int32_t* ds = nullptr,
                          i64 span = 0) {
  return reference<double>(rig, rig.params_d(), to_double(x), B, T, ds, span);
}

// fp32 error depth of the mixer's forward (testing.h fp32_tol, docs/testing.md): q/k/v projections over D,
// conv width 4 + SiLU, L2 norm over K, the chunked delta rule (tokens summed into the state: T, or the span;
// K per state product; C in the within-chunk triangular solve), RMSNorm over K and its SiLU gate, o_proj
// over H*K, and the gate projections over D. beta = sigmoid(z) scales its head's output; at the extremes of
// set_gates (z ~ -9) it amplifies z's relative error by kappa = |z| = 9.
double gdn_depth(i64 D, i64 H, i64 K, i64 C, i64 T, double beta_kappa = 1) {
  const double d = static_cast<double>(D);
  return fp32_depth({d, 4 + 1, double(K), double(T + K + C), double(K), 1, double(H * K), d * beta_kappa * beta_kappa, d});
}
constexpr double kGateKappa = 9;

// Inputs with channel 0 held at 1: a constant feature that acts as a bias of every projection, so the gates
// can be pushed to their extremes through the weights' column 0.
std::vector<float> biased_input(i64 B, i64 T, i64 D, uint64_t seed) {
  auto x = randn(static_cast<size_t>(B * T * D), seed);
  for (i64 n = 0; n < B * T; ++n) x[n * D] = 1.f;
  return x;
}

enum class Gates { Typical, AlphaOneBetaOne, AlphaZeroBetaZero, Mixed };

// Sets A_log, dt_bias and column 0 of a_proj / b_proj: alpha = exp(g) near 1 (g ~ -1e-5) or near 0
// (g ~ -30), beta near 1 (sigmoid(+9)) or near 0 (sigmoid(-9)). Mixed: head 0 (1, 0), head 1 (0, 1).
void set_gates(MixerRig& rig, Gates mode) {
  const i64 H = dynamic_cast<const GatedDeltaNetMixer&>(*rig.m).n_heads(), D = rig.D;
  float *alog = rig.param("A_log"), *dtb = rig.param("dt_bias");
  float *Wa = rig.param("a_proj.weight"), *Wb = rig.param("b_proj.weight");
  for (i64 h = 0; h < H; ++h) {
    bool a_one = false, b_one = false;
    switch (mode) {
      case Gates::Typical: continue;
      case Gates::AlphaOneBetaOne: a_one = b_one = true; break;
      case Gates::AlphaZeroBetaZero: break;
      case Gates::Mixed: a_one = h % 2 == 0, b_one = h % 2 == 1; break;
    }
    alog[h] = a_one ? -9.f : std::log(16.f);
    dtb[h] = a_one ? -3.f : 0.5f;
    Wa[h * D] = a_one ? 0.f : 1.5f;
    Wb[h * D] = b_one ? 9.f : -9.f;
  }
}

void perturb_norm(MixerRig& rig, uint64_t seed) {
  Rng r(seed);
  const i64 K = dynamic_cast<const GatedDeltaNetMixer&>(*rig.m).head_dim();
  float* w = rig.param("o_norm.weight");
  for (i64 i = 0; i < K; ++i) w[i] = static_cast<float>(1.0 + r.uniform(-0.2, 0.2));
}

}  // namespace

TEST(GdnMixer, RegistryNamesShapesInitAndDecay) {
  MixerRig rig(gdn_cfg(32, 2, 16, 8), 1);
  const i64 D = 32, HK = 32, H = 2;
  struct Want {
    const char* name;
    Shape shape;
    bool decay;
  };
  const Want want[] = {{"q_proj.weight", {HK, D}, true},      {"k_proj.weight", {HK, D}, true},
                       {"v_proj.weight", {HK, D}, true},      {"g_proj.weight", {HK, D}, true},
                       {"b_proj.weight", {H, D}, true},       {"a_proj.weight", {H, D}, true},
                       {"q_conv1d.weight", {HK, 1, 4}, true}, {"k_conv1d.weight", {HK, 1, 4}, true},
                       {"v_conv1d.weight", {HK, 1, 4}, true}, {"A_log", {H}, false},
                       {"dt_bias", {H}, false},               {"o_norm.weight", {16}, false},
                       {"o_proj.weight", {D, HK}, true}};
  ASSERT_EQ(rig.reg.all().size(), std::size(want));
  for (const auto& w : want) {
    const auto& p = rig.info(w.name);
    EXPECT_EQ(p.name, std::string("model.layers.1.linear_attn.") + w.name);
    EXPECT_EQ(p.shape, w.shape) << w.name;
    EXPECT_EQ(p.decay, w.decay) << w.name;
  }
  // The fused matmul and conv rely on adjacency.
  EXPECT_EQ(rig.info("k_proj.weight").offset, rig.info("q_proj.weight").offset + HK * D);
  EXPECT_EQ(rig.info("a_proj.weight").offset, rig.info("b_proj.weight").offset + H * D);
  EXPECT_EQ(rig.info("b_proj.weight").offset, rig.info("g_proj.weight").offset + HK * D);
  EXPECT_EQ(rig.info("v_conv1d.weight").offset, rig.info("k_conv1d.weight").offset + HK * 4);

  // Init over many heads: A in (0, 16], dt = softplus(dt_bias) in [1e-4, 0.1], conv in [-1/2, 1/2].
  MixerRig big(gdn_cfg(32, 256, 4, 8), 0);
  big.init(5);
  const float* alog = big.param("A_log");
  const float* dtb = big.param("dt_bias");
  double amin = 1e9, amax = 0, dmin = 1e9, dmax = 0;
  for (i64 h = 0; h < 256; ++h) {
    const double A = std::exp(double(alog[h])), dt = std::log1p(std::exp(double(dtb[h])));
    amin = std::min(amin, A), amax = std::max(amax, A), dmin = std::min(dmin, dt), dmax = std::max(dmax, dt);
  }
  EXPECT_GT(amin, 0.0);
  EXPECT_LT(amin, 1.0);  // lower bound 0, not Mamba-2's 1
  EXPECT_LE(amax, 16.0 * (1 + 1e-6));
  EXPECT_GT(amax, 14.0);
  EXPECT_GE(dmin, 1e-4 * (1 - 1e-4));
  EXPECT_LT(dmin, 2e-3);
  EXPECT_LE(dmax, 0.1 * (1 + 1e-4));
  EXPECT_GT(dmax, 0.05);
  const float* cw = big.param("q_conv1d.weight");
  float cmax = 0;
  for (i64 i = 0; i < 3 * 256 * 4 * 4; ++i) cmax = std::max(cmax, std::fabs(cw[i]));
  EXPECT_LE(cmax, 0.5f);
  EXPECT_GT(cmax, 0.45f);
  EXPECT_EQ(big.param("o_norm.weight")[3], 1.f);
}

TEST(GdnMixer, FlopsAndArenaBounds) {
  MixerRig rig(gdn_cfg(64, 2, 32, 16), 0);
  rig.init(1, 5.0);
  const auto f = rig.m->flops_per_token(1024);
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * ((4 * 64 + 2 * 2) * 64.0 + 64.0 * 64));
  EXPECT_DOUBLE_EQ(f.core, 2 * (8.0 * 16 * 32 + 6.0 * 32 * 32) + 2.0 * 4 * 3 * 64);
  const i64 B = 2, T = 75;
  const auto x = randn(static_cast<size_t>(B * T * 64), 3);
  std::vector<int32_t> ds = periodic_doc_start(B, T, 5);  // row 1: many segments
  std::fill(ds.begin(), ds.begin() + T, 0);               // row 0: one document
  expect_arena_use_exact(rig, x, B, T);
  // Row 1's segments overflow the chunk-state budget: forward keeps none, backward recomputes them.
  expect_arena_within_bounds(rig, x, B, T, ds.data());
}

TEST(GdnMixer, ForwardMatchesTokenByTokenReference) {
  MixerRig rig(gdn_cfg(64, 2, 32, 16), 0);
  rig.init(7, 10.0);
  perturb_norm(rig, 8);
  const i64 B = 2, T = 75;
  const auto x = randn(static_cast<size_t>(B * T * 64), 9);
  EXPECT_TRUE(close_rel(rig.forward(x, B, T), ref_d(rig, x, B, T), fp32_tol(gdn_depth(64, 2, 32, 16, T)), "forward"));
  for (Gates gm : {Gates::AlphaOneBetaOne, Gates::AlphaZeroBetaZero, Gates::Mixed}) {
    set_gates(rig, gm);
    const auto xb = biased_input(B, T, 64, 10);
    EXPECT_TRUE(close_rel(rig.forward(xb, B, T), ref_d(rig, xb, B, T), fp32_tol(gdn_depth(64, 2, 32, 16, T, kGateKappa)),
                          "forward, gates " + std::to_string(int(gm))));
  }
}

TEST(GdnMixer, GradientsMatchExactReferenceGradientsAtGateExtremes) {
  const i64 B = 2, T = 17, D = 16;
  std::vector<int32_t> ds(static_cast<size_t>(B * T));
  for (i64 t = 0; t < T; ++t) ds[t] = t < 9 ? 0 : 9, ds[T + t] = 0;
  for (Gates gm : {Gates::Typical, Gates::AlphaOneBetaOne, Gates::AlphaZeroBetaZero, Gates::Mixed}) {
    MixerRig rig(gdn_cfg(D, 2, 8, 8), 0);
    rig.init(11, 10.0);
    perturb_norm(rig, 12);
    set_gates(rig, gm);
    const auto x = biased_input(B, T, D, 13);
    const int32_t* d = gm == Gates::Mixed ? ds.data() : nullptr;
    MixerRefC ref = [&](const std::vector<cplx>& P, const std::vector<cplx>& xx) {
      return reference<cplx>(rig, P, xx, B, T, d, 0);
    };
    // Forward and backward chains, plus the longest gradient sum: A_log and dt_bias over B*T tokens x K*K state.
    const double depth = 2 * gdn_depth(D, 2, 8, 8, T, kGateKappa) + double(B * T * 8 * 8);
    check_grads_vs_reference(rig, x, B, T, d, ref, fp32_tol(depth), "gates " + std::to_string(int(gm)));
  }
}

TEST(GdnMixer, Fp32GradientsMatchRichardsonFiniteDifferences) {
  const i64 B = 2, T = 40, D = 32;
  // One head with alpha ~ 1, beta ~ 0, the other with alpha ~ 0, beta ~ 1 (every mode is checked exactly above).
  MixerRig rig(gdn_cfg(D, 2, 16, 16), 0);
  rig.init(21, 10.0);
  perturb_norm(rig, 22);
  set_gates(rig, Gates::Mixed);
  check_grads_fp32_richardson(rig, biased_input(B, T, D, 23), B, T, nullptr, "mixed gates");
}

TEST(GdnMixer, PackedDocumentsEqualSeparateRuns) {
  const i64 B = 2, T = 150, D = 32;
  // Few documents (the chunk-entry states fit the saved budget) and many short ones (recomputed states).
  const std::vector<std::vector<std::vector<i64>>> layouts = {{{0, 37, 100}, {0, 64}},
                                                              {{0, 1, 2, 70, 71, 72, 73, 140}, {0, 3, 6, 9, 12, 15, 149}}};
  for (const auto& starts : layouts) {
    MixerRig rig(gdn_cfg(D, 2, 16, 16), 0);
    rig.init(31, 10.0);
    perturb_norm(rig, 32);
    const auto x = randn(static_cast<size_t>(B * T * D), 33), dy = randn(static_cast<size_t>(B * T * D), 34);
    const std::vector<int32_t> ds = packed_doc_start(T, starts);
    rig.zero_grad();
    const auto y = rig.forward(x, B, T, ds.data());
    const auto dx = rig.backward(x, dy, B, T, ds.data());
    const auto g_packed = rig.grads();
    EXPECT_TRUE(close_rel(y, ref_d(rig, x, B, T, ds.data()), fp32_tol(gdn_depth(D, 2, 16, 16, T)), "packed vs reference"));
    std::vector<float> y_sep(y.size()), dx_sep(dx.size());
    rig.zero_grad();
    for (i64 b = 0; b < B; ++b)
      for (size_t i = 0; i < starts[b].size(); ++i) {
        const i64 t0 = starts[b][i], t1 = i + 1 < starts[b].size() ? starts[b][i + 1] : T;
        const auto xs = slice_tokens(x, T, D, b, t0, t1), dys = slice_tokens(dy, T, D, b, t0, t1);
        const auto ys = rig.forward(xs, 1, t1 - t0);
        const auto dxs = rig.backward(xs, dys, 1, t1 - t0);
        std::copy(ys.begin(), ys.end(), y_sep.begin() + (b * T + t0) * D);
        std::copy(dxs.begin(), dxs.end(), dx_sep.begin() + (b * T + t0) * D);
      }
    // Two fp32 runs (each side's depth); gradients: both forward + backward chains and the B*T*K*K gate sums.
    const double fwd = gdn_depth(D, 2, 16, 16, T), grad = 2 * (2 * fwd + double(B * T * 16 * 16));
    EXPECT_TRUE(close_rel(y, y_sep, fp32_tol(2 * fwd), "packed y"));
    EXPECT_TRUE(close_rel(dx, dx_sep, fp32_tol(grad), "packed dx"));
    EXPECT_TRUE(close_rel(g_packed, rig.grads(), fp32_tol(grad), "packed parameter gradients"));
  }
}

TEST(GdnMixer, StepDecodeEqualsForwardPastTheChunk) {
  const i64 B = 2, T = 150, D = 64;
  MixerRig rig(gdn_cfg(D, 2, 64, 64), 0);
  rig.init(41, 10.0);
  perturb_norm(rig, 42);
  const auto x = randn(static_cast<size_t>(B * T * D), 43);
  const auto y = rig.forward(x, B, T);
  EXPECT_TRUE(close_rel(y, ref_d(rig, x, B, T), fp32_tol(gdn_depth(D, 2, 64, 64, T)), "forward vs reference"));
  EXPECT_TRUE(close_rel(rig.decode(x, B, T), y, fp32_tol(2 * gdn_depth(D, 2, 64, 64, T)), "decode vs forward"));
  auto st = rig.m->new_state(B, T);
  EXPECT_EQ(st->bytes(), static_cast<i64>(sizeof(float)) * B * (3 * 3 * 2 * 64 + 2 * 64 * 64));
}

TEST(GdnMixer, PrefillThenStepEqualsForward) {
  const i64 B = 2, T = 150, D = 64;
  MixerRig rig(gdn_cfg(D, 2, 64, 64), 0);
  rig.init(51, 10.0);
  perturb_norm(rig, 52);
  const auto x = randn(static_cast<size_t>(B * T * D), 53);
  const auto y = rig.forward(x, B, T);
  auto st = rig.m->new_state(B, T);
  std::vector<float> got = nan_vec(y.size());
  rig.prefill(x, got, B, T, *st, 0, 70);  // crosses a chunk boundary
  const auto dec = rig.decode(x, B, T, st.get(), 70, 100);
  for (i64 b = 0; b < B; ++b)
    std::copy(dec.begin() + (b * T + 70) * D, dec.begin() + (b * T + 100) * D, got.begin() + (b * T + 70) * D);
  rig.prefill(x, got, B, T, *st, 100, 101);  // a one-token prefill
  rig.prefill(x, got, B, T, *st, 101, T);    // from a non-zero state, past another chunk
  EXPECT_TRUE(close_rel(got, y, fp32_tol(2 * gdn_depth(D, 2, 64, 64, T)), "prefill + step vs forward"));
}

TEST(GdnMixer, MaxSpanResetsTheStateEverySpanTokens) {
  const i64 B = 2, T = 150, D = 32, span = 40;
  MixerRig rig(gdn_cfg(D, 2, 16, 16), 0);
  rig.init(61, 10.0);
  perturb_norm(rig, 62);
  const auto x = randn(static_cast<size_t>(B * T * D), 63), dy = randn(static_cast<size_t>(B * T * D), 64);
  const std::vector<int32_t> ds = periodic_doc_start(B, T, span);
  rig.zero_grad();
  const auto y_doc = rig.forward(x, B, T, ds.data());
  const auto dx_doc = rig.backward(x, dy, B, T, ds.data());
  const auto g_doc = rig.grads();
  rig.m->set_max_span(span);
  rig.zero_grad();
  const auto y = rig.forward(x, B, T);
  const auto dx = rig.backward(x, dy, B, T);
  EXPECT_TRUE(close_rel(y, ref_d(rig, x, B, T, nullptr, span), fp32_tol(gdn_depth(D, 2, 16, 16, span)),
                        "span forward vs reference"));
  EXPECT_TRUE(close_rel(y, y_doc, 1e-7, "span == doc_start every span"));
  EXPECT_TRUE(close_rel(dx, dx_doc, 1e-7, "span dx"));
  EXPECT_TRUE(close_rel(rig.grads(), g_doc, 1e-7, "span parameter gradients"));
  // Pieces: a reset inside the first, the second ends on a span boundary, the third starts on one.
  expect_decode_and_pieces_equal_forward(rig, x, B, T, y, {55, 80}, fp32_tol(2 * gdn_depth(D, 2, 16, 16, span)));
  rig.m->set_max_span(0);
}

TEST(GdnMixer, ModelPrefillAndDecodeEqualTheFullForward) {
  // Whole-model wiring (Model::prefill / decode_step over G and F layers), 3 chunks of 8.
  json j = {{"d_model", 32},  {"n_layers", 3},      {"n_heads", 2},        {"n_kv_heads", 2},
            {"head_dim", 16}, {"d_ff", 48},         {"vocab_size", 37},    {"max_seq_len", 64},
            {"pattern", "GGF"}, {"chunk_size", 8}, {"layer_types", {{"F", {{"rope", true}}}}}};
  const ModelConfig cfg = ModelConfig::from_json(j, "test");
  Model m(cfg);
  m.init(71);
  const i64 B = 2, T = 23, V = cfg.vocab_size, P = 10;
  Rng r(72);
  std::vector<int32_t> in(static_cast<size_t>(B * T));
  for (auto& t : in) t = static_cast<int32_t>(r.below(V));
  std::vector<float> full = nan_vec(static_cast<size_t>(B * T * V));
  m.forward_logits(in.data(), nullptr, B, T, full.data());
  DecodeState st = m.new_decode_state(B, T);
  std::vector<int32_t> prompt;
  for (i64 b = 0; b < B; ++b) prompt.insert(prompt.end(), in.begin() + b * T, in.begin() + b * T + P);
  std::vector<float> pre = nan_vec(static_cast<size_t>(B * P * V)), step = nan_vec(static_cast<size_t>(B * V));
  std::vector<float> got = nan_vec(full.size());
  m.prefill(prompt.data(), B, P, st, nullptr, pre.data());
  for (i64 b = 0; b < B; ++b)
    std::copy(pre.begin() + b * P * V, pre.begin() + (b + 1) * P * V, got.begin() + b * T * V);
  for (i64 t = P; t < T; ++t) {
    int32_t tok[2] = {in[t], in[T + t]};
    m.decode_step(tok, st, step.data());
    for (i64 b = 0; b < B; ++b) std::copy(step.begin() + b * V, step.begin() + (b + 1) * V, got.begin() + (b * T + t) * V);
  }
  EXPECT_TRUE(close_rel(got, full, 1e-5, "model decode vs forward"));
}
