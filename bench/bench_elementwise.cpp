// Elementwise kernels at the bench config's shapes (B*T = 8192 tokens, d_model 256, d_ff 768, 4 heads x 64):
// SwiGLU, RMSNorm and RoPE, forward + backward. They are memory bound, so the rate is in GB/s of the arrays each
// pass reads and writes once. Compare SIMD targets in one sitting with HLM_SIMD=fallback / AVX2 / AVX3.
#include <benchmark/benchmark.h>

#include <vector>

#include "core/rng.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

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

}  // namespace
