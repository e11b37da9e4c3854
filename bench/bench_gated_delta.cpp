// Micro-benchmarks of the gated delta rule at the bench config: B=8, T=1024, H=4, K=V=64, chunk 64, q/k/v
// inside a fused row of stride 3*256 = 768 (as the mixer will lay them out).
// Counters: GFLOP/s = counted flops / wall time, with the count H*(8*C*64 + 6*64^2) per token for the chunked
// forward (four C x C x 64 and three 64 x 64 products per chunk, per token) and 2x that for the backward;
// the recurrent forward and the decode step count 6*K*V per token and head.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <vector>

#include "bench_precision.h"
#include "core/rng.h"
#include "ops/gated_delta.h"

using hlm::i64;

namespace {

constexpr i64 kB = 8, kT = 1024, kH = 4, kK = 64, kV = 64, kC = 64, kStride = kH * (2 * kK + kV);

struct Buffers {
  std::vector<float> qkv, g, beta, o, fin, dout, dqkv, dg, dbeta, states;
  hlm::ops::GatedDeltaArgs<float> a;
  Buffers() {
    hlm::Rng r(1);
    qkv.resize(kB * kT * kStride);
    for (i64 n = 0; n < kB * kT; ++n)
      for (i64 part = 0; part < 2; ++part)  // q and k heads: unit rows (q also scaled by K^-1/2)
        for (i64 h = 0; h < kH; ++h) {
          float* x = qkv.data() + n * kStride + part * kH * kK + h * kK;
          double ss = 0;
          for (i64 i = 0; i < kK; ++i) x[i] = static_cast<float>(r.normal()), ss += double(x[i]) * x[i];
          const double sc = (part == 0 ? 1 / std::sqrt(double(kK)) : 1.0) / std::sqrt(ss);
          for (i64 i = 0; i < kK; ++i) x[i] = static_cast<float>(x[i] * sc);
        }
    for (i64 n = 0; n < kB * kT; ++n)
      for (i64 i = 0; i < kH * kV; ++i) qkv[n * kStride + 2 * kH * kK + i] = static_cast<float>(r.normal());
    g.resize(kB * kT * kH);
    beta.resize(g.size());
    for (auto& x : g) x = static_cast<float>(-std::log1p(std::exp(r.normal() - 1)));
    for (auto& x : beta) x = static_cast<float>(1 / (1 + std::exp(-r.normal())));
    o.resize(kB * kT * kH * kV);
    dout.resize(o.size());
    for (auto& x : dout) x = static_cast<float>(r.normal());
    fin.resize(kB * kH * kK * kV);
    dqkv.resize(qkv.size());
    dg.resize(g.size());
    dbeta.resize(g.size());
    a.B = kB, a.T = kT, a.H = kH, a.K = kK, a.V = kV, a.chunk = kC;
    a.q = qkv.data(), a.k = qkv.data() + kH * kK, a.v = qkv.data() + 2 * kH * kK;
    a.q_stride = a.k_stride = a.v_stride = kStride;
    a.g = g.data(), a.beta = beta.data();
    states.resize(hlm::ops::gated_delta_chunk_states_numel(a));
  }
  void forward() { hlm::ops::gated_delta_chunked_forward(a, o.data(), fin.data(), states.data()); }
  void backward(bool saved) {
    float* d = dqkv.data();
    hlm::ops::GatedDeltaGrads<float> gr{d, d + kH * kK, d + 2 * kH * kK, dg.data(), dbeta.data(), nullptr};
    hlm::ops::gated_delta_chunked_backward(a, saved ? states.data() : nullptr, dout.data(), nullptr, gr);
  }
};

double chunked_forward_flops() { return double(kB * kT) * kH * (8.0 * kC * 64 + 6.0 * 64 * 64); }

void set_rate(benchmark::State& st, double flops) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_GatedDeltaChunkedForward(benchmark::State& st) {
  Buffers b;
  for (auto _ : st) {
    b.forward();
    benchmark::DoNotOptimize(b.o.data());
  }
  set_rate(st, chunked_forward_flops());
}
BENCHMARK(BM_GatedDeltaChunkedForward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg 1: chunk-boundary states saved by the forward; 0: recomputed by the backward.
void BM_GatedDeltaChunkedBackward(benchmark::State& st) {
  Buffers b;
  b.forward();
  for (auto _ : st) {
    b.backward(st.range(0) != 0);
    benchmark::DoNotOptimize(b.dqkv.data());
  }
  set_rate(st, 2 * chunked_forward_flops());
}
BENCHMARK(BM_GatedDeltaChunkedBackward)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg 0: 1 = under --precision bf16 (the chunk's small products in bf16).
void BM_GatedDeltaChunkedForwardBackward(benchmark::State& st) {
  std::unique_ptr<hlm::ops::PrecisionScope> scope;
  if (!hlm::bench::precision_of(st, 0, scope)) return;
  Buffers b;
  for (auto _ : st) {
    b.forward();
    b.backward(true);
    benchmark::DoNotOptimize(b.dqkv.data());
  }
  set_rate(st, 3 * chunked_forward_flops());
}
BENCHMARK(BM_GatedDeltaChunkedForwardBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GatedDeltaRecurrentForward(benchmark::State& st) {
  Buffers b;
  for (auto _ : st) {
    hlm::ops::gated_delta_recurrent_forward(b.a, b.o.data(), b.fin.data());
    benchmark::DoNotOptimize(b.o.data());
  }
  set_rate(st, double(kB * kT) * kH * 6.0 * kK * kV);
}
BENCHMARK(BM_GatedDeltaRecurrentForward)->Unit(benchmark::kMillisecond)->UseRealTime();

// One decoding step for all B rows (token 0 of each row; the state keeps evolving across iterations).
void BM_GatedDeltaStep(benchmark::State& st) {
  Buffers b;
  hlm::ops::GatedDeltaArgs<float> a = b.a;
  a.T = 1;
  a.q_stride = a.k_stride = a.v_stride = kT * kStride;
  std::vector<float> g1(kB * kH, -0.1f), beta1(kB * kH, 0.5f), state(kB * kH * kK * kV, 0.f), o(kB * kH * kV);
  a.g = g1.data(), a.beta = beta1.data();
  for (auto _ : st) {
    hlm::ops::gated_delta_step(a, state.data(), o.data());
    benchmark::DoNotOptimize(o.data());
  }
  set_rate(st, double(kB) * kH * 6.0 * kK * kV);
}
BENCHMARK(BM_GatedDeltaStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
