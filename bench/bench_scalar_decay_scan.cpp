// Micro-benchmarks of the scalar-decay scan (ops/scalar_decay_scan.h) and the causal conv1d at the bench
// shapes, B=8, T=1024, chunk 64, laid out as the mixers lay them out:
//   Lightning: H = Hk = 4, K = V = 64, q | k | v in one fused row of stride 3*256.
//   Mamba-2:   H = 8 heads of V = 64, one shared B/C group (Hk = 1) of K = 64 inside the xBC row
//              [x (512) | B (64) | C (64)]; v = dt * x is its own [B, T, H, V] buffer.
// GFLOP/s = counted flops / wall time. The count is the matmul work the kernel does, with C x C products
// counted dense (half of them are masked), per token and head (G = H / Hk heads share q/k products):
//   forward   2KV (chunk state) + 2CV (P V) + 2KV (Q S) + 2CK/G (Q K^T)
//   backward  8KV (Q^T dO, K dS, V dS^T, dO S^T) + 4CV (dO V^T, P^T dO) + 6CK/G (Q K^T, dPG K, dPG^T Q)
// (the backward with recomputed states adds 2KV).
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <vector>

#include "bench_precision.h"
#include "core/rng.h"
#include "ops/causal_conv1d.h"
#include "ops/scalar_decay_scan.h"

using hlm::i64;

namespace {

constexpr i64 kB = 8, kT = 1024, kC = 64, kK = 64, kV = 64;

struct Shape {
  i64 H, Hk;
};
constexpr Shape kLightning{4, 4}, kMamba{8, 1};

struct Buffers {
  Shape s;
  std::vector<float> row, vbuf, g, o, fin, dout, drow, dvbuf, dg, states, ws;
  hlm::ops::ScalarDecayArgs<float> a;
  explicit Buffers(Shape sh) : s(sh) {
    hlm::Rng r(1);
    const bool mamba = s.Hk == 1 && s.H > 1;
    const i64 stride = mamba ? s.H * kV + 2 * kK : 3 * s.H * kK;
    row.resize(kB * kT * stride);
    for (auto& x : row) x = static_cast<float>(r.normal() * 0.125);
    g.resize(kB * kT * s.H);
    for (auto& x : g) x = static_cast<float>(mamba ? -0.05 * (1 + r.uniform()) * 4 : -0.1);
    o.resize(kB * kT * s.H * kV);
    dout.resize(o.size());
    for (auto& x : dout) x = static_cast<float>(r.normal());
    fin.resize(kB * s.H * kK * kV);
    drow.resize(row.size());
    dg.resize(g.size());
    a.B = kB, a.T = kT, a.H = s.H, a.Hk = s.Hk, a.K = kK, a.V = kV, a.chunk = kC;
    if (mamba) {
      vbuf.resize(o.size());
      for (auto& x : vbuf) x = static_cast<float>(r.normal() * 0.1);
      dvbuf.resize(vbuf.size());
      a.k = row.data() + s.H * kV, a.q = row.data() + s.H * kV + kK;  // k = B, q = C
      a.q_stride = a.k_stride = stride;
      a.v = vbuf.data();
    } else {
      a.q = row.data(), a.k = row.data() + s.H * kK, a.v = row.data() + 2 * s.H * kK;
      a.q_stride = a.k_stride = a.v_stride = stride;
    }
    a.g = g.data();
    states.resize(hlm::ops::scalar_decay_chunk_states_numel(a));
    ws.resize(hlm::ops::scalar_decay_backward_workspace_numel(a));
  }
  void forward() { hlm::ops::scalar_decay_chunked_forward(a, o.data(), fin.data(), states.data()); }
  void backward(bool saved) {
    float* dq = drow.data() + (a.q - row.data());
    float* dk = drow.data() + (a.k - row.data());
    float* dv = vbuf.empty() ? drow.data() + (a.v - row.data()) : dvbuf.data();
    hlm::ops::scalar_decay_chunked_backward(a, saved ? states.data() : nullptr, dout.data(), nullptr,
                                            {.dq = dq, .dk = dk, .dv = dv, .dg = dg.data()}, ws.data());
  }
  double fwd_flops() const {
    const double G = double(s.H / s.Hk);
    return double(kB * kT) * s.H * (4.0 * kK * kV + 2.0 * kC * kV + 2.0 * kC * kK / G);
  }
  double bwd_flops(bool saved) const {
    const double G = double(s.H / s.Hk);
    return double(kB * kT) * s.H * ((saved ? 8.0 : 10.0) * kK * kV + 4.0 * kC * kV + 6.0 * kC * kK / G);
  }
};

void set_rate(benchmark::State& st, double flops) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// Arg 0: Lightning shape, 1: Mamba-2 shape.
Shape shape_of(const benchmark::State& st) { return st.range(0) ? kMamba : kLightning; }

void BM_ScalarDecayChunkedForward(benchmark::State& st) {
  Buffers b(shape_of(st));
  for (auto _ : st) {
    b.forward();
    benchmark::DoNotOptimize(b.o.data());
  }
  set_rate(st, b.fwd_flops());
}
BENCHMARK(BM_ScalarDecayChunkedForward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Second arg 1: chunk states saved by the forward; 0: recomputed by the backward (what Lightning does).
void BM_ScalarDecayChunkedBackward(benchmark::State& st) {
  Buffers b(shape_of(st));
  b.forward();
  const bool saved = st.range(1) != 0;
  for (auto _ : st) {
    b.backward(saved);
    benchmark::DoNotOptimize(b.dg.data());
  }
  set_rate(st, b.bwd_flops(saved));
}
BENCHMARK(BM_ScalarDecayChunkedBackward)
    ->Args({0, 1})
    ->Args({0, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Arg 1: 1 = under --precision bf16 (the chunk's small products in bf16).
void BM_ScalarDecayChunkedForwardBackward(benchmark::State& st) {
  std::unique_ptr<hlm::ops::PrecisionScope> scope;
  if (!hlm::bench::precision_of(st, 1, scope)) return;
  Buffers b(shape_of(st));
  for (auto _ : st) {
    b.forward();
    b.backward(true);
    benchmark::DoNotOptimize(b.dg.data());
  }
  set_rate(st, b.fwd_flops() + b.bwd_flops(true));
}
BENCHMARK(BM_ScalarDecayChunkedForwardBackward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Decode: one token for the whole batch (6 K V flops per head: decay, rank-1 update, read-out).
void BM_ScalarDecayStep(benchmark::State& st) {
  const Shape s = shape_of(st);
  Buffers b(s);
  hlm::ops::ScalarDecayArgs<float> a = b.a;
  a.T = 1;
  std::vector<float> state(kB * s.H * kK * kV, 0.f), o(kB * s.H * kV);
  for (auto _ : st) {
    hlm::ops::scalar_decay_step(a, state.data(), o.data());
    benchmark::DoNotOptimize(o.data());
  }
  set_rate(st, 6.0 * kB * s.H * kK * kV);
}
BENCHMARK(BM_ScalarDecayStep)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Mamba-2's conv over xBC: C = 512 + 2*64 channels, width 4, fused SiLU; flops 2*W per output.
void BM_CausalConv1dForwardBackward(benchmark::State& st) {
  const i64 C = 640, W = 4;
  hlm::Rng r(2);
  std::vector<float> u(kB * kT * C), w(C * W), bias(C), y(u.size()), dy(u.size()), du(u.size()), dw(C * W),
      db(C);
  for (auto* v : {&u, &w, &bias, &dy})
    for (auto& x : *v) x = static_cast<float>(r.normal());
  hlm::ops::CausalConv1dArgs<float> a;
  a.B = kB, a.T = kT, a.C = C, a.W = W, a.silu = true;
  a.u = u.data(), a.w = w.data(), a.bias = bias.data();
  for (auto _ : st) {
    hlm::ops::causal_conv1d_forward(a, y.data(), nullptr);
    hlm::ops::causal_conv1d_backward(a, dy.data(), {.du = du.data(), .dw = dw.data(), .dbias = db.data()});
    benchmark::DoNotOptimize(du.data());
  }
  set_rate(st, 4 * 2.0 * W * kB * kT * C);  // forward; backward: pre-activation recompute, du, dw
}
BENCHMARK(BM_CausalConv1dForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
