// Mamba-2 mixer (src/mixers/mamba2.*): a plain double token-by-token reference of the whole mixer (in_proj,
// causal conv + SiLU, softplus dt, SSM recurrence, D skip, gated RMSNorm, out_proj), finite-difference
// gradients of every parameter and the input, decay extremes (A_log / dt_bias pushed to both ends), packed
// documents, decoding and prefill past the chunk size, the probe's max span, init, FLOP/memory accounting
// (the float64 PyTorch golden file of a Mamba-2 hybrid: tests/test_golden.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "mixer_harness.h"
#include "mixers/mamba2.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

ModelConfig mamba_cfg(i64 D, i64 P, i64 N, i64 chunk, i64 n_layers = 4) {
  json j = {{"d_model", D},      {"n_layers", n_layers}, {"n_heads", 2},        {"n_kv_heads", 2},
            {"head_dim", 8},     {"d_ff", 2 * D},        {"vocab_size", 17},    {"max_seq_len", 4096},
            {"pattern", "M"},    {"chunk_size", chunk},  {"mamba_d_state", N}, {"mamba_expand", 2},
            {"layer_types", {{"M", {{"head_dim", P}}}}}};
  return ModelConfig::from_json(j, "test");
}

template <typename S>
S silu(S x) {
  return x / (1.0 + std::exp(-x));
}
template <typename S>
S softplus(S x) {
  return std::real(x) > 30 ? x : std::log(1.0 + std::exp(x));
}

// y[B, T, D] of the whole mixer, token by token (S = double for outputs, std::complex<double> for exact
// complex-step gradients). A document start (or, with span > 0, every multiple of span) clears the SSM
// state and hides earlier tokens from the convolution.
template <typename S>
std::vector<S> reference(const MixerRig& rig, const std::vector<S>& Pv, const std::vector<S>& x, i64 B, i64 T,
                         const int32_t* ds, i64 span) {
  const auto& mm = dynamic_cast<const Mamba2Mixer&>(*rig.m);
  const i64 D = rig.D, di = mm.d_inner(), nh = mm.n_heads(), P = mm.head_dim(), N = mm.d_state();
  const i64 C = di + 2 * N, Win = 2 * di + 2 * N + nh;
  const S* Win_w = Pv.data() + rig.info("in_proj.weight").offset;
  const S* cw = Pv.data() + rig.info("conv1d.weight").offset;
  const S* cb = Pv.data() + rig.info("conv1d.bias").offset;
  const S* dtb = Pv.data() + rig.info("dt_bias").offset;
  const S* alog = Pv.data() + rig.info("A_log").offset;
  const S* Dp = Pv.data() + rig.info(".D").offset;
  const S* wn = Pv.data() + rig.info("norm.weight").offset;
  const S* Wo = Pv.data() + rig.info("out_proj.weight").offset;
  std::vector<S> y(static_cast<size_t>(B * T * D));
  for (i64 b = 0; b < B; ++b) {
    std::vector<S> h(static_cast<size_t>(nh * P * N), S(0));
    std::vector<std::vector<S>> pre(static_cast<size_t>(T));
    i64 seg = 0;  // first token of the current document / span block
    for (i64 t = 0; t < T; ++t) {
      const bool reset = (ds && t > 0 && ds[b * T + t] == t) || (span > 0 && t > 0 && t % span == 0);
      if (reset) {
        std::fill(h.begin(), h.end(), S(0));
        seg = t;
      }
      const S* xr = x.data() + (b * T + t) * D;
      auto& pr = pre[t];
      pr.assign(static_cast<size_t>(Win), S(0));
      for (i64 o = 0; o < Win; ++o)
        for (i64 d = 0; d < D; ++d) pr[o] += Win_w[o * D + d] * xr[d];
      std::vector<S> xbc(static_cast<size_t>(C));
      for (i64 c = 0; c < C; ++c) {
        S acc = cb[c];
        for (i64 j = 0; j < 4; ++j) {
          const i64 s = t - 3 + j;
          if (s >= seg) acc += cw[c * 4 + j] * pre[s][di + c];
        }
        xbc[c] = silu(acc);
      }
      const S* xs = xbc.data();
      const S* Bm = xbc.data() + di;
      const S* Cm = xbc.data() + di + N;
      std::vector<S> ys(static_cast<size_t>(di));
      for (i64 hh = 0; hh < nh; ++hh) {
        const S dt = softplus(pr[2 * di + 2 * N + hh] + dtb[hh]);
        const S a = std::exp(-std::exp(alog[hh]) * dt);
        for (i64 p = 0; p < P; ++p) {
          S acc(0);
          for (i64 n = 0; n < N; ++n) {
            S& st = h[(hh * P + p) * N + n];
            st = a * st + dt * xs[hh * P + p] * Bm[n];
            acc += st * Cm[n];
          }
          ys[hh * P + p] = acc + Dp[hh] * xs[hh * P + p];
        }
      }
      S ss(0);
      for (i64 i = 0; i < di; ++i) {
        ys[i] *= silu(pr[i]);
        ss += ys[i] * ys[i];
      }
      const S rs = 1.0 / std::sqrt(ss / static_cast<double>(di) + 1e-5);
      for (i64 d = 0; d < D; ++d) {
        S acc(0);
        for (i64 i = 0; i < di; ++i) acc += Wo[d * di + i] * ys[i] * rs * wn[i];
        y[(b * T + t) * D + d] = acc;
      }
    }
  }
  return y;
}

// fp32 error depth of the mixer's forward (testing.h fp32_tol, docs/testing.md): in_proj over D, conv width 4 +
// SiLU, dt = softplus(.) and the decay exp(dt A), the chunked scan (tokens summed into the state: T or the span;
// d_state N per C.h product; the chunk C), the D skip, the SiLU(z) gate, RMSNorm over d_inner and out_proj
// over d_inner.
double mamba_depth(i64 D, i64 di, i64 N, i64 C, i64 T) {
  return fp32_depth({double(D), 4 + 1, 2, double(T + N + C), 1, 1, double(di), double(di)});
}

// Parameters with signal everywhere: larger projections, non-trivial D, norm and conv bias.
void init_rig(MixerRig& rig, std::uint64_t seed) {
  rig.init(seed, 10.0);
  Rng r(seed + 100);
  for (const char* n : {".D", "norm.weight"}) {
    const auto& p = rig.info(n);
    for (i64 i = 0; i < p.shape.numel(); ++i) rig.param(n)[i] = static_cast<float>(1 + r.uniform(-0.3, 0.3));
  }
  const auto& cb = rig.info("conv1d.bias");
  for (i64 i = 0; i < cb.shape.numel(); ++i) rig.param("conv1d.bias")[i] = static_cast<float>(r.uniform(-0.2, 0.2));
}

// dt_bias / A_log pushed so exp(dt A) sits at one end: "slow" ~ 1 - 1e-6, "fast" ~ e^-60.
void set_decay(MixerRig& rig, const char* mode) {
  const auto& p = rig.info("dt_bias");
  for (i64 h = 0; h < p.shape.numel(); ++h) {
    if (std::string(mode) == "slow") {
      rig.param("dt_bias")[h] = -9.f;
      rig.param("A_log")[h] = -3.f;
    } else {
      rig.param("dt_bias")[h] = 3.f + 0.2f * static_cast<float>(h);
      rig.param("A_log")[h] = std::log(16.f);
    }
  }
}

}  // namespace

TEST(Mamba2Mixer, RegistersNamesShapesAndInit) {
  MixerRig rig(mamba_cfg(16, 8, 8, 4), 2);
  const auto& in = rig.info("in_proj.weight");
  EXPECT_EQ(in.name, "model.layers.2.mixer.in_proj.weight");
  EXPECT_EQ(in.shape.dims[0], 2 * 32 + 2 * 8 + 4);
  EXPECT_EQ(rig.info("conv1d.weight").shape.ndim, 3);
  EXPECT_EQ(rig.info("conv1d.weight").shape.dims[0], 32 + 16);
  EXPECT_EQ(rig.info("conv1d.weight").shape.dims[2], 4);
  for (const char* n : {"conv1d.bias", "dt_bias", "A_log", ".D", "norm.weight"}) EXPECT_FALSE(rig.info(n).decay) << n;
  for (const char* n : {"in_proj.weight", "conv1d.weight", "out_proj.weight"}) EXPECT_TRUE(rig.info(n).decay) << n;
  // Init (docs/model.md): dt in [1e-3, 0.1] through softplus(dt_bias), A in [1, 16], D = 1, conv in +-1/2.
  MixerRig big(mamba_cfg(256, 8, 8, 4), 0);  // 64 heads
  big.init(7);
  const i64 nh = big.info("dt_bias").shape.numel();
  double lo = 1, hi = 0;
  for (i64 h = 0; h < nh; ++h) {
    const double dt = softplus(static_cast<double>(big.param("dt_bias")[h])), A = std::exp(big.param("A_log")[h]);
    lo = std::min(lo, dt), hi = std::max(hi, dt);
    EXPECT_GE(dt, 1e-3 * 0.999);
    EXPECT_LE(dt, 0.1 * 1.001);
    EXPECT_GE(A, 1.0 - 1e-6);
    EXPECT_LE(A, 16.0 + 1e-5);
    EXPECT_EQ(big.param(".D")[h], 1.f);
  }
  EXPECT_LT(lo, 3e-3);  // log-uniform over two decades
  EXPECT_GT(hi, 3e-2);
  const auto& cw = big.info("conv1d.weight");
  for (i64 i = 0; i < cw.shape.numel(); ++i) ASSERT_LE(std::fabs(big.param("conv1d.weight")[i]), 0.5f);
  // Inverse softplus test vector (docs/algorithms.md §4.4): dt = 0.01 -> -4.600166.
  EXPECT_NEAR(0.01 + std::log(-std::expm1(-0.01)), -4.600166, 1e-6);
}

TEST(Mamba2Mixer, ChunkedForwardMatchesTokenByTokenReference) {
  const i64 B = 2, D = 16;
  for (const char* mode : {"init", "slow", "fast"})
    for (i64 T : {37, 32}) {  // chunk 8: a partial last chunk, and a whole number of chunks
      MixerRig rig(mamba_cfg(D, 8, 8, 8), 1);
      init_rig(rig, 1);
      if (std::string(mode) != "init") set_decay(rig, mode);
      const auto x = randn(static_cast<size_t>(B * T * D), 2);
      const auto y = rig.forward(x, B, T);
      const auto ref = reference(rig, rig.params_d(), to_double(x), B, T, nullptr, 0);
      EXPECT_TRUE(close_rel(y, ref, fp32_tol(mamba_depth(D, 2 * D, 8, 8, T)), std::string(mode) + " T=" + std::to_string(T)));
    }
}

// Every parameter entry and input entry against exact complex-step gradients of the reference, plain and
// packed, plus a few entries through the fp32 forward itself.
void gradient_check(const char* mode) {
  const i64 B = 2, T = 11, D = 12;
  const auto ds = packed_doc_start(T, {{0, 5}, {0}});
  MixerRig rig(mamba_cfg(D, 6, 5, 4), 0);
  init_rig(rig, 3);
  if (std::string(mode) != "init") set_decay(rig, mode);
  const auto x = randn(static_cast<size_t>(B * T * D), 4);
  // Forward and backward chains plus the longest gradient sum: A_log, dt_bias and D over B*T tokens x the
  // head's P*N state entries.
  const double tol = fp32_tol(2 * mamba_depth(D, 2 * D, 5, 4, T) + double(B * T * 6 * 5));
  const double w1 = check_grads_vs_reference(
      rig, x, B, T, nullptr,
      [&](const std::vector<cplx>& P, const std::vector<cplx>& xd) { return reference(rig, P, xd, B, T, nullptr, 0); },
      tol, mode);
  const double w2 = check_grads_vs_reference(
      rig, x, B, T, ds.data(),
      [&](const std::vector<cplx>& P, const std::vector<cplx>& xd) {
        return reference(rig, P, xd, B, T, ds.data(), 0);
      },
      tol, std::string(mode) + " packed");
  ::testing::Test::RecordProperty(std::string("worst_rel_error_") + mode, fmt::format("{:.3g}", std::max(w1, w2)));
  check_grads_fp32_richardson(rig, x, B, T, ds.data(), mode);
}

TEST(Mamba2Mixer, GradientsMatchReferenceAtInit) { gradient_check("init"); }
TEST(Mamba2Mixer, GradientsMatchReferenceWithDecayNearOne) { gradient_check("slow"); }
TEST(Mamba2Mixer, GradientsMatchReferenceWithDecayNearZero) { gradient_check("fast"); }

TEST(Mamba2Mixer, PackedDocumentsEqualSeparateRuns) {
  const i64 B = 2, T = 30, D = 16;
  const std::vector<std::vector<i64>> starts = {{0, 2, 11, 25}, {0, 17}};
  MixerRig rig(mamba_cfg(D, 8, 8, 8), 1);
  init_rig(rig, 5);
  const auto x = randn(static_cast<size_t>(B * T * D), 6);
  const auto dy = randn(x.size(), 7);
  // Two fp32 runs of forward + backward (each side: both chains and the B*T*P*N gradient sums).
  expect_packed_equals_separate(rig, x, dy, B, T, D, starts,
                                fp32_tol(2 * (2 * mamba_depth(D, 2 * D, 8, 8, T) + B * T * 8 * 8)));
}

TEST(Mamba2Mixer, DecodeEqualsForwardPastTheChunk) {
  const i64 B = 2, D = 32;
  MixerRig rig(mamba_cfg(D, 16, 16, 64), 1);
  init_rig(rig, 8);
  for (i64 T : {150, 128}) {  // a partial last chunk, and a whole number of chunks
    const auto x = randn(static_cast<size_t>(B * T * D), 9);
    const auto y = rig.forward(x, B, T);
    EXPECT_TRUE(close_rel(rig.decode(x, B, T), y, fp32_tol(2 * mamba_depth(D, 2 * D, 16, 64, T)), "decode T=" + std::to_string(T)));
  }
  // Constant-size state: conv (3 x (di + 2N)) + SSM (nh x N x P) per row.
  EXPECT_EQ(rig.m->new_state(B, 100000)->bytes(),
            static_cast<i64>(B * (3 * (64 + 32) + 4 * 16 * 16) * sizeof(float)));
}

TEST(Mamba2Mixer, PrefillThenStepEqualsForward) {
  const i64 B = 2, T = 150, D = 32;
  MixerRig rig(mamba_cfg(D, 16, 16, 64), 2);
  init_rig(rig, 10);
  const auto x = randn(static_cast<size_t>(B * T * D), 11);
  const auto y = rig.forward(x, B, T);
  auto st = rig.m->new_state(B, T);
  std::vector<float> out = nan_vec(x.size());
  rig.prefill(x, out, B, T, *st, 0, 70);    // crosses a chunk boundary
  rig.prefill(x, out, B, T, *st, 70, 72);   // shorter than the conv width: the conv state carries through
  rig.prefill(x, out, B, T, *st, 72, 110);  // from a non-zero state
  const auto tail = rig.decode(x, B, T, st.get(), 110, T);
  for (i64 b = 0; b < B; ++b)
    std::copy(tail.begin() + (b * T + 110) * D, tail.begin() + (b * T + T) * D, out.begin() + (b * T + 110) * D);
  EXPECT_TRUE(close_rel(out, y, fp32_tol(2 * mamba_depth(D, 2 * D, 16, 64, T)), "prefill + step"));
}

TEST(Mamba2Mixer, MaxSpanResetsTheStateEverySpanTokens) {
  const i64 B = 2, T = 40, D = 16, span = 7;
  MixerRig rig(mamba_cfg(D, 8, 8, 8), 3);
  init_rig(rig, 12);
  set_decay(rig, "slow");
  const auto x = randn(static_cast<size_t>(B * T * D), 13);
  const auto y_full = rig.forward(x, B, T);
  rig.m->set_max_span(span);
  const auto y = rig.forward(x, B, T);
  const auto ref = reference(rig, rig.params_d(), to_double(x), B, T, nullptr, span);
  EXPECT_TRUE(close_rel(y, ref, fp32_tol(mamba_depth(D, 2 * D, 8, 8, span)), "span forward"));
  EXPECT_FALSE(close_rel(y_full, ref, 1e-3, "span has an effect"));
  expect_decode_and_pieces_equal_forward(rig, x, B, T, y, {14, 30}, fp32_tol(2 * mamba_depth(D, 2 * D, 8, 8, span)));
}

TEST(Mamba2Mixer, FlopsAndMemoryBoundsAreHonest) {
  MixerRig rig(mamba_cfg(256, 64, 64, 64, 8), 0);
  const FlopCount f = rig.m->flops_per_token(1024);
  const double Win = 2 * 512 + 2 * 64 + 8;
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * (Win * 256 + 256 * 512));
  EXPECT_DOUBLE_EQ(f.core, 2.0 * 64 * 64 + 8.0 * (2 * 64 * 64 + 4 * 64 * 64));
  MixerRig small(mamba_cfg(16, 8, 8, 8), 0);
  small.init(1);
  const i64 B = 3, T = 29;
  const auto x = randn(static_cast<size_t>(B * T * 16), 1);
  expect_arena_use_exact(small, x, B, T);
}
