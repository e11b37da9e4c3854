// Elementwise kernels at the bench config's shapes (B*T = 8192 tokens, d_model 256, d_ff 768, 4 heads x 64):
// SwiGLU, RMSNorm, RoPE, the linear mixers' gates (Mamba-2: d_inner 512 = 8 heads x 64, d_state 64; Gated
// DeltaNet: 4 heads x 64) and GDN's q/k L2 norm, forward + backward. They are memory bound, so the rate is in GB/s of the arrays each
// pass reads and writes once. Compare SIMD targets in one sitting with HLM_SIMD=fallback / AVX2 / AVX3.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "ops/gated_unit.h"
#include "ops/l2norm.h"
#include "ops/matmul_bf16.h"
#include "ops/mixer_gates.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace {

using hlm::i64;
constexpr i64 kN = 8192, kD = 256, kF = 768, kH = 4, kHd = 64;

std::vector<float> randn(size_t n, std::uint64_t seed) {
  hlm::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal());
  return v;
}

void set_bytes(benchmark::State& st, double floats) {
  st.counters["GB/s"] =
      benchmark::Counter(4 * floats, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_SwiGLUForwardBackward(benchmark::State& st) {
  const auto gu = randn(kN * 2 * kF, 1), dh = randn(kN * kF, 2);
  std::vector<float> h(kN * kF), dgu(kN * 2 * kF);
  for (auto _ : st) {
    hlm::ops::swiglu_forward(gu.data(), h.data(), kN, kF);
    hlm::ops::swiglu_backward(gu.data(), dh.data(), dgu.data(), kN, kF);
    benchmark::DoNotOptimize(dgu.data());
  }
  set_bytes(st, kN * kF * (3.0 + 5.0));  // forward: gu in, h out; backward: gu, dh in, dgu out
}
BENCHMARK(BM_SwiGLUForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// The bf16 step's variants: the same passes reading gate|up in bf16 and writing h and d gate|up rounded to bf16, dgu
// over dh's memory and the product into its own buffer, as the model's bf16 MLP backward calls them.
void BM_SwiGLUForwardBackwardBf16(benchmark::State& st) {
  const auto gu32 = randn(kN * 2 * kF, 1), dh0 = randn(kN * kF, 2);
  std::vector<hlm::ops::bf16> gu(gu32.size());
  hlm::ops::round_to_bf16(gu32.data(), 1, kN * 2 * kF, kN * 2 * kF, gu.data());
  std::vector<float> dh = dh0;
  std::vector<hlm::ops::bf16> h(kN * kF);
  for (auto _ : st) {
    st.PauseTiming();  // the backward overwrote dh with d gate|up
    std::copy(dh0.begin(), dh0.end(), dh.begin());
    st.ResumeTiming();
    hlm::ops::swiglu_forward_bf16(gu.data(), h.data(), kN, kF);
    hlm::ops::swiglu_backward_bf16(gu.data(), dh.data(), reinterpret_cast<hlm::ops::bf16*>(dh.data()), kN, kF,
                                   h.data());
    benchmark::DoNotOptimize(dh.data());
  }
  set_bytes(st, kN * kF * (1.5 + 3.5));  // in fp32 words: forward gu in, h out; backward gu, dh in, dgu, h out
}
BENCHMARK(BM_SwiGLUForwardBackwardBf16)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RMSNormForwardBackward(benchmark::State& st) {
  const auto x = randn(kN * kD, 3), w = randn(kD, 4), dy = randn(kN * kD, 5);
  std::vector<float> y(kN * kD), rstd(kN), dx(kN * kD), dw(kD);
  for (auto _ : st) {
    hlm::ops::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), kN, kD, 1e-5f);
    hlm::ops::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), kN, kD);
    benchmark::DoNotOptimize(dx.data());
  }
  set_bytes(st, kN * kD * (2.0 + 3.0));  // forward: x in, y out; backward: x, dy in, dx out
}
BENCHMARK(BM_RMSNormForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RoPEForwardBackward(benchmark::State& st) {
  const hlm::ops::RopeTable tab(1024, kHd, 10000.0);
  auto q = randn(kN * kH * kHd, 6);
  for (auto _ : st) {
    hlm::ops::rope_forward(tab, q.data(), kN / 1024, 1024, kH, kH * kHd, nullptr);
    hlm::ops::rope_backward(tab, q.data(), kN / 1024, 1024, kH, kH * kHd, nullptr);
    benchmark::DoNotOptimize(q.data());
  }
  set_bytes(st, kN * kH * kHd * 4.0);  // q read and written, twice
}
BENCHMARK(BM_RoPEForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// One Mamba-2 layer's gates (the in_proj row is z | xBC | dt): dt / value rows, D skip + silu(z) gate, the
// backward's recompute, the gate's backward and the dt backward.
void BM_Mamba2GatesForwardBackward(benchmark::State& st) {
  constexpr i64 H = 8, P = 64, F = H * P, S = 64, C = F + 2 * S, W = F + C + H;
  const auto pre = randn(kN * W, 7), xbc = randn(kN * C, 8), rstd = randn(kN, 9), w = randn(F, 10),
             dyg = randn(kN * F, 11), dv = randn(kN * F, 12), dg = randn(kN * H, 13);
  const std::vector<float> bias(H, -3.f), A(H, -2.f), D(H, 1.f);
  std::vector<float> dt(kN * H), g(kN * H), v(kN * F), ys = randn(kN * F, 14), yg(kN * F), yn(kN * F), dys(kN * F),
      dpre(kN * W), dxbc(kN * C), part(3 * kN * H);
  for (auto _ : st) {
    hlm::ops::mamba2_dt_forward(pre.data() + F + C, W, bias.data(), A.data(), xbc.data(), C, dt.data(), g.data(),
                                v.data(), kN, H, P);
    hlm::ops::mamba2_skip_gate_forward(ys.data(), xbc.data(), C, D.data(), pre.data(), W, yg.data(), kN, H, P);
    hlm::ops::silu_gate_norm_recompute(ys.data(), pre.data(), W, rstd.data(), w.data(), yg.data(), yn.data(), kN, F);
    hlm::ops::silu_gate_backward(ys.data(), pre.data(), W, dyg.data(), dys.data(), dpre.data(), W, kN, F);
    hlm::ops::mamba2_dt_backward(xbc.data(), C, dv.data(), dys.data(), dt.data(), D.data(), A.data(), dg.data(),
                                 dxbc.data(), C, dpre.data() + F + C, W, part.data(), kN, H, P);
    benchmark::DoNotOptimize(dxbc.data());
  }
  // dt: x in, v out; skip gate: y, x, z in, y, yg out; recompute: y, z in, yg, yn out; backward: y, z, dyg in,
  // dy, dz out; dt backward: x, dv, dys in, dx out.
  set_bytes(st, kN * F * (2.0 + 5.0 + 4.0 + 5.0 + 4.0));
}
BENCHMARK(BM_Mamba2GatesForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Lightning's activations (silu on q | k | v, sigmoid on the gate) over one layer's projections [N, 4HK]: run
// in forward and again in backward, which recomputes them rather than keeping them (docs/memory.md).
void BM_LightningActivate(benchmark::State& st) {
  constexpr i64 HK = kH * kHd;
  const auto pre = randn(kN * 4 * HK, 21);
  std::vector<float> act(pre.size());
  for (auto _ : st) {
    hlm::ops::lightning_activate(pre.data(), act.data(), 4 * HK, act.data() + 3 * HK, 4 * HK, kN, HK);
    benchmark::DoNotOptimize(act.data());
  }
  set_bytes(st, kN * 4.0 * HK * 2.0);  // pre in, act out
}
BENCHMARK(BM_LightningActivate)->Unit(benchmark::kMillisecond)->UseRealTime();

// Gated DeltaNet's output gate RMSNorm_K(o) w silu(gp): forward, the backward's recompute, backward.
void BM_GdnOutGateForwardBackward(benchmark::State& st) {
  constexpr i64 HK = kH * kHd, Wp = 4 * HK + 2 * kH;
  const auto o = randn(kN * HK, 15), proj = randn(kN * Wp, 16), w = randn(kHd, 17), dz = randn(kN * HK, 18);
  std::vector<float> rstd(kN * kH), z(kN * HK), d_o(kN * HK), dproj(kN * Wp), dw(kHd);
  for (auto _ : st) {
    hlm::ops::norm_silu_gate_forward(o.data(), proj.data() + 3 * HK, Wp, w.data(), rstd.data(), true, z.data(), kN,
                                     kH, kHd, 1e-6f);
    hlm::ops::norm_silu_gate_forward(o.data(), proj.data() + 3 * HK, Wp, w.data(), rstd.data(), false, z.data(), kN,
                                     kH, kHd, 1e-6f);
    hlm::ops::norm_silu_gate_backward(o.data(), proj.data() + 3 * HK, Wp, w.data(), rstd.data(), dz.data(),
                                      d_o.data(), dproj.data() + 3 * HK, dw.data(), kN, kH, kHd);
    benchmark::DoNotOptimize(d_o.data());
  }
  set_bytes(st, kN * HK * (3.0 + 3.0 + 5.0));  // o, gp in, z out (twice); o, gp, dz in, d_o, d_gp out
}
BENCHMARK(BM_GdnOutGateForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Gated DeltaNet's q and k L2 norms, in place in the conv output rows [N, 3HK], forward + backward.
void BM_L2NormForwardBackward(benchmark::State& st) {
  constexpr i64 HK = kH * kHd, C3 = 3 * HK;
  auto qkv = randn(kN * C3, 19);
  const auto dqkv0 = randn(kN * C3, 20);
  std::vector<float> dqkv(kN * C3), rq(kN * kH), rk(kN * kH);
  for (auto _ : st) {
    hlm::ops::l2norm_forward<float>(qkv.data(), C3, qkv.data(), C3, rq.data(), kN, kH, kHd, 1e-6f, 0.125f);
    hlm::ops::l2norm_forward<float>(qkv.data() + HK, C3, qkv.data() + HK, C3, rk.data(), kN, kH, kHd, 1e-6f, 1.f);
    hlm::ops::l2norm_backward<float>(qkv.data(), C3, rq.data(), dqkv0.data(), C3, dqkv.data(), C3, kN, kH, kHd,
                                     0.125f);
    hlm::ops::l2norm_backward<float>(qkv.data() + HK, C3, rk.data(), dqkv0.data() + HK, C3, dqkv.data() + HK, C3, kN,
                                     kH, kHd, 1.f);
    benchmark::DoNotOptimize(dqkv.data());
  }
  set_bytes(st, kN * 2 * HK * (2.0 + 3.0));  // q and k: x in, y out; y, dy in, dx out
}
BENCHMARK(BM_L2NormForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
