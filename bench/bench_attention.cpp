// Micro-benchmarks of causal softmax attention at the bench config: B=8, T=1024, H=Hkv=4, hd=64, q/k/v
// inside a fused row of stride 3*256 = 768. Arg 0: window (0 = full causal, else W keys incl. self); arg 1: 1 = under
// --precision bf16 (the products in bf16 where the CPU has AVX512_BF16, ops/bf16_pairs.h; skipped elsewhere).
// Counters: GFLOP/s = causal flops / wall time, forward 4*hd*pairs per head where pairs = sum_t min(t+1, W)
// (T^2/2 for full causal), backward 2.5x forward.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bench_precision.h"
#include "core/rng.h"
#include "ops/attention.h"

using hlm::i64;

namespace {

constexpr i64 kB = 8, kT = 1024, kH = 4, kHd = 64, kStride = 3 * kH * kHd;

std::vector<float> randn(size_t n, uint64_t seed) {
  hlm::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal());
  return v;
}

// The bench shape with q | k | v of the fused rows in qkv.
hlm::ops::AttentionArgs args(i64 window, const float* qkv) {
  hlm::ops::AttentionArgs a;
  a.B = kB, a.T = kT, a.H = kH, a.Hkv = kH, a.hd = kHd, a.window = window;
  a.q = qkv, a.k = qkv + kH * kHd, a.v = qkv + 2 * kH * kHd, a.q_stride = a.kv_stride = kStride;
  return a;
}

double forward_flops(i64 window) {
  const i64 W = window == 0 ? kT : window;
  double pairs = 0;
  for (i64 t = 0; t < kT; ++t) pairs += static_cast<double>(std::min(t + 1, W));
  return 4.0 * kHd * pairs * kB * kH;
}

struct Buffers {
  std::vector<float> qkv = randn(kB * kT * kStride, 1), dout = randn(kB * kT * kH * kHd, 2);
  std::vector<float> o = std::vector<float>(kB * kT * kH * kHd), lse = std::vector<float>(kB * kH * kT);
  std::vector<float> dqkv = std::vector<float>(kB * kT * kStride);
  void forward(i64 window) {
    hlm::ops::attention_forward(args(window, qkv.data()), o.data(), lse.data());
  }
  void backward(i64 window) {
    float* g = dqkv.data();
    hlm::ops::attention_backward(args(window, qkv.data()), o.data(), lse.data(), dout.data(),
                                 {g, g + kH * kHd, g + 2 * kH * kHd});
  }
};

void BM_AttentionForward(benchmark::State& st) {
  std::unique_ptr<hlm::ops::PrecisionScope> scope;
  if (!hlm::bench::precision_of(st, 1, scope)) return;
  Buffers b;
  for (auto _ : st) {
    b.forward(st.range(0));
    benchmark::DoNotOptimize(b.o.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(forward_flops(st.range(0)), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionForward)->ArgsProduct({{0, 128}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AttentionBackward(benchmark::State& st) {
  std::unique_ptr<hlm::ops::PrecisionScope> scope;
  if (!hlm::bench::precision_of(st, 1, scope)) return;
  Buffers b;
  b.forward(st.range(0));
  for (auto _ : st) {
    b.backward(st.range(0));
    benchmark::DoNotOptimize(b.dqkv.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(
      2.5 * forward_flops(st.range(0)), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionBackward)->ArgsProduct({{0, 128}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
