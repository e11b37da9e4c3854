// Lightning Attention mixer (src/mixers/lightning.*): a plain double token-by-token reference of the whole
// mixer, finite-difference gradients of every parameter and the input, decay extremes (first and last
// layer of the MiniMax schedule), packed documents, decoding and prefill past the chunk size, the probe's
// max span, FLOP/memory accounting (the float64 PyTorch golden file of a Lightning hybrid: tests/test_golden.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "mixer_harness.h"
#include "mixers/lightning.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

ModelConfig lightning_cfg(i64 D, i64 H, i64 hd, i64 chunk, i64 n_layers = 4) {
  json j = {{"d_model", D},  {"n_layers", n_layers}, {"n_heads", H},          {"n_kv_heads", H},
            {"head_dim", hd}, {"d_ff", 2 * D},        {"vocab_size", 17},     {"max_seq_len", 4096},
            {"pattern", "L"}, {"chunk_size", chunk}};
  return ModelConfig::from_json(j, "test");
}

template <typename S>
S silu(S x) {
  return x / (1.0 + std::exp(-x));
}
template <typename S>
S sigmoid(S x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// y[B, T, D] of the whole mixer, token by token (S = double for outputs, std::complex<double> for exact
// complex-step gradients). Resets the state at document starts and, with span > 0, at every multiple of
// span (the probe hook).
template <typename S>
std::vector<S> reference(const MixerRig& rig, const std::vector<S>& P, const std::vector<S>& x, i64 B, i64 T,
                         const int32_t* ds, i64 span, const std::vector<double>& slopes) {
  const auto& t = rig.cfg.layer_type(0);
  const i64 D = rig.D, H = t.n_heads, hd = t.head_dim, HK = H * hd;
  const S* Wq = P.data() + rig.info("q_proj.weight").offset;
  const S* Wk = P.data() + rig.info("k_proj.weight").offset;
  const S* Wv = P.data() + rig.info("v_proj.weight").offset;
  const S* Wg = P.data() + rig.info("output_gate.weight").offset;
  const S* wn = P.data() + rig.info("norm.weight").offset;
  const S* Wo = P.data() + rig.info("o_proj.weight").offset;
  std::vector<S> y(static_cast<size_t>(B * T * D));
  for (i64 b = 0; b < B; ++b) {
    std::vector<S> St(static_cast<size_t>(H * hd * hd), S(0));
    for (i64 tt = 0; tt < T; ++tt) {
      const bool reset = (ds && tt > 0 && ds[b * T + tt] == tt) || (span > 0 && tt > 0 && tt % span == 0);
      if (reset) std::fill(St.begin(), St.end(), S(0));
      const S* xr = x.data() + (b * T + tt) * D;
      std::vector<S> q(HK), k(HK), v(HK), g(HK), o(HK, S(0));
      for (i64 i = 0; i < HK; ++i) {
        S aq(0), ak(0), av(0), ag(0);
        for (i64 d = 0; d < D; ++d) {
          aq += Wq[i * D + d] * xr[d];
          ak += Wk[i * D + d] * xr[d];
          av += Wv[i * D + d] * xr[d];
          ag += Wg[i * D + d] * xr[d];
        }
        q[i] = silu(aq), k[i] = silu(ak), v[i] = silu(av), g[i] = sigmoid(ag);
      }
      for (i64 h = 0; h < H; ++h) {
        const double lam = std::exp(-slopes[h]);
        S* Sh = St.data() + h * hd * hd;  // [K, V]
        for (i64 i = 0; i < hd; ++i)
          for (i64 j = 0; j < hd; ++j) Sh[i * hd + j] = lam * Sh[i * hd + j] + k[h * hd + i] * v[h * hd + j];
        for (i64 j = 0; j < hd; ++j)
          for (i64 i = 0; i < hd; ++i) o[h * hd + j] += Sh[i * hd + j] * q[h * hd + i];
      }
      S ss(0);
      for (const S& e : o) ss += e * e;
      const S rs = 1.0 / std::sqrt(ss / static_cast<double>(HK) + 1e-6);
      std::vector<S> u(HK);
      for (i64 i = 0; i < HK; ++i) u[i] = o[i] * rs * wn[i] * g[i];
      for (i64 d = 0; d < D; ++d) {
        S acc(0);
        for (i64 i = 0; i < HK; ++i) acc += Wo[d * HK + i] * u[i];
        y[(b * T + tt) * D + d] = acc;
      }
    }
  }
  return y;
}

// fp32 error depth of the mixer's forward (testing.h fp32_tol, docs/testing.md): q/k/v/gate projections over
// D + SiLU, the chunked scan (tokens summed into the state: T or the span; hd per state product; C inside a
// chunk), RMSNorm over H*hd, the sigmoid gate, o_proj over H*hd.
double lightning_depth(i64 D, i64 H, i64 hd, i64 C, i64 T) {
  return fp32_depth({double(D), 1, double(T + hd + C), double(H * hd), 1, double(H * hd)});
}

const LightningMixer& lm(const MixerRig& rig) { return dynamic_cast<const LightningMixer&>(*rig.m); }

}  // namespace

TEST(LightningMixer, MinimaxSlopes) {
  // docs/algorithms.md §3.2 test vector: H = 8, layer 0 -> 2^-1 .. 2^-8 (times the layer factor 1 + 1e-5).
  const auto s = lightning_minimax_slopes(8, 0, 4);
  for (int h = 0; h < 8; ++h) EXPECT_NEAR(s[h], std::pow(2.0, -(h + 1)) * (1 + 1e-5), 1e-15) << h;
  // L = 4: layer factors 1.00001, 0.666678, 0.333346, 1.3e-5.
  const double want[4] = {1.00001, 0.666678, 0.333346, 1.3e-5};
  for (int l = 0; l < 4; ++l) EXPECT_NEAR(lightning_minimax_slopes(8, l, 4)[0] / 0.5, want[l], 2e-6) << l;
  EXPECT_THROW(lightning_minimax_slopes(0, 0, 4), Error);
}

TEST(LightningMixer, RegistersHuggingFaceNamesAdjacentForTheFusedMatmul) {
  MixerRig rig(lightning_cfg(16, 2, 8, 4), 0);
  const auto& q = rig.info("q_proj.weight");
  EXPECT_EQ(q.name, "model.layers.0.linear_attn.q_proj.weight");
  EXPECT_EQ(rig.info("k_proj.weight").offset, q.offset + 16 * 16);
  EXPECT_EQ(rig.info("v_proj.weight").offset, q.offset + 2 * 16 * 16);
  EXPECT_EQ(rig.info("output_gate.weight").offset, q.offset + 3 * 16 * 16);
  EXPECT_FALSE(rig.info("norm.weight").decay);
  EXPECT_TRUE(rig.info("o_proj.weight").decay);
  EXPECT_NEAR(rig.info("o_proj.weight").init_a, 0.02 / std::sqrt(8.0), 1e-12);
}

TEST(LightningMixer, ChunkedForwardMatchesTokenByTokenReference) {
  const i64 B = 2;
  // Layer 0: strongest decay of the schedule; layer 3 of 4: lambda = exp(-1.3e-5 s), almost none.
  for (i64 layer : {0, 1, 3})
    for (i64 T : {37, 32}) {  // chunk 8: a partial last chunk, and a whole number of chunks
      MixerRig rig(lightning_cfg(16, 2, 8, 8), layer);
      rig.init(1, 10.0);
      const auto x = randn(static_cast<size_t>(B * T * 16), 2);
      const auto y = rig.forward(x, B, T);
      const auto ref = reference(rig, rig.params_d(), to_double(x), B, T, nullptr, 0, lm(rig).slopes());
      EXPECT_TRUE(close_rel(y, ref, fp32_tol(lightning_depth(16, 2, 8, 8, T)),
                            "layer " + std::to_string(layer) + " T=" + std::to_string(T)));
    }
}

TEST(LightningMixer, GradientsMatchFiniteDifferences) {
  const i64 B = 2, T = 11;
  const auto ds = packed_doc_start(T, {{0, 6}, {0}});
  for (i64 layer : {0, 3}) {
    MixerRig rig(lightning_cfg(12, 2, 6, 4), layer);
    rig.init(3, 10.0);
    const auto x = randn(static_cast<size_t>(B * T * 12), 4);
    const auto sl = lm(rig).slopes();
    const std::string tag = "layer " + std::to_string(layer);
    // Forward and backward chains plus the longest gradient sum (weights: B*T tokens).
    const double tol = fp32_tol(2 * lightning_depth(12, 2, 6, 4, T) + double(B * T));
    const double w1 = check_grads_vs_reference(
        rig, x, B, T, nullptr,
        [&](const std::vector<cplx>& P, const std::vector<cplx>& xd) {
          return reference(rig, P, xd, B, T, nullptr, 0, sl);
        },
        tol, tag);
    const double w2 = check_grads_vs_reference(
        rig, x, B, T, ds.data(),
        [&](const std::vector<cplx>& P, const std::vector<cplx>& xd) {
          return reference(rig, P, xd, B, T, ds.data(), 0, sl);
        },
        tol, tag + " packed");
    RecordProperty("worst_rel_error_" + tag, fmt::format("{:.3g}", std::max(w1, w2)));
    check_grads_fp32_richardson(rig, x, B, T, ds.data(), tag);
  }
}

TEST(LightningMixer, PackedDocumentsEqualSeparateRuns) {
  const i64 B = 2, T = 30, D = 16;
  const std::vector<std::vector<i64>> starts = {{0, 11, 25}, {0, 17}};
  MixerRig rig(lightning_cfg(D, 2, 8, 8), 1);
  rig.init(5, 10.0);
  const auto x = randn(static_cast<size_t>(B * T * D), 6);
  const auto dy = randn(x.size(), 7);
  // Two fp32 runs of forward + backward (each side: both chains and the B*T gradient sums).
  expect_packed_equals_separate(rig, x, dy, B, T, D, starts, fp32_tol(2 * (2 * lightning_depth(D, 2, 8, 8, T) + B * T)));
}

TEST(LightningMixer, DecodeEqualsForwardPastTheChunk) {
  const i64 B = 2, D = 32;
  MixerRig rig(lightning_cfg(D, 2, 16, 64), 1);
  rig.init(8, 5.0);
  for (i64 T : {150, 128}) {  // a partial last chunk, and a whole number of chunks
    const auto x = randn(static_cast<size_t>(B * T * D), 9);
    const auto y = rig.forward(x, B, T);
    EXPECT_TRUE(close_rel(rig.decode(x, B, T), y, fp32_tol(2 * lightning_depth(D, 2, 16, 64, T)), "decode T=" + std::to_string(T)));
  }
  // State size is constant: B * H * hd * hd floats.
  EXPECT_EQ(rig.m->new_state(B, 100000)->bytes(), static_cast<i64>(B * 2 * 16 * 16 * sizeof(float)));
}

TEST(LightningMixer, PrefillThenStepEqualsForward) {
  const i64 B = 2, T = 150, D = 32;
  MixerRig rig(lightning_cfg(D, 2, 16, 64), 2);
  rig.init(10, 5.0);
  const auto x = randn(static_cast<size_t>(B * T * D), 11);
  const auto y = rig.forward(x, B, T);
  auto st = rig.m->new_state(B, T);
  std::vector<float> out = nan_vec(x.size());
  rig.prefill(x, out, B, T, *st, 0, 70);    // crosses a chunk boundary
  rig.prefill(x, out, B, T, *st, 70, 110);  // from a non-zero state
  const auto tail = rig.decode(x, B, T, st.get(), 110, T);
  for (i64 b = 0; b < B; ++b)
    std::copy(tail.begin() + (b * T + 110) * D, tail.begin() + (b * T + T) * D, out.begin() + (b * T + 110) * D);
  EXPECT_TRUE(close_rel(out, y, fp32_tol(2 * lightning_depth(D, 2, 16, 64, T)), "prefill + step"));
}

TEST(LightningMixer, MaxSpanResetsTheStateEverySpanTokens) {
  const i64 B = 2, T = 40, D = 16, span = 7;
  MixerRig rig(lightning_cfg(D, 2, 8, 8), 3);
  rig.init(12, 10.0);
  const auto x = randn(static_cast<size_t>(B * T * D), 13);
  const auto y_full = rig.forward(x, B, T);
  rig.m->set_max_span(span);
  const auto y = rig.forward(x, B, T);
  const auto ref = reference(rig, rig.params_d(), to_double(x), B, T, nullptr, span, lm(rig).slopes());
  EXPECT_TRUE(close_rel(y, ref, fp32_tol(lightning_depth(D, 2, 8, 8, span)), "span forward"));
  EXPECT_FALSE(close_rel(y_full, ref, 1e-3, "span has an effect"));
  // On and off span boundaries.
  expect_decode_and_pieces_equal_forward(rig, x, B, T, y, {14, 30}, fp32_tol(2 * lightning_depth(D, 2, 8, 8, span)));
}

TEST(LightningMixer, FlopsAndMemoryBoundsAreHonest) {
  MixerRig rig(lightning_cfg(256, 4, 64, 64, 8), 0);
  const FlopCount f = rig.m->flops_per_token(1024);
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * (4 * 256 * 256 + 256 * 256));
  EXPECT_DOUBLE_EQ(f.core, 4.0 * (4 * 64 * 64 + 4 * 64 * 64));
  // Measured arena use stays within the declared bounds.
  MixerRig small(lightning_cfg(16, 2, 8, 8), 0);
  small.init(1);
  const i64 B = 3, T = 29;
  const auto x = randn(static_cast<size_t>(B * T * 16), 1);
  expect_arena_use_exact(small, x, B, T);
}
