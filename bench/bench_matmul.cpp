// Micro-benchmarks of the dense hot ops: sgemm at the bench-config qkv projection shape and 2048^3, and
// the fused LM-head cross-entropy (forward + backward) at N=8192, D=256, V=4096; the same under --precision bf16
// (BM_MatmulBf16 / BM_MatmulBf16Layout: the bf16 product alone; BM_MatmulOutputSize, BM_MatmulBf16RowStride: the
// output size and row alignment at bench shapes; BM_LinearBf16: linear_forward with its operand
// rounding; BM_WeightGradBf16: a weight gradient with its rounding in both forms; BM_LmHeadCE/1).
// Counters: GFLOP/s = useful flops / wall time (matmul 2MNK; CE forward 2NDV, backward 3 x 2NDV).
// Every operand is 64-byte aligned, as the engine's arena and buffers are: oneDNN's AMX kernels run up to 1.9x slower
// on a product whose output rows start 16 bytes off a cache line (where malloc puts large blocks).
#include <benchmark/benchmark.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/aligned.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cross_entropy.h"
#include "ops/matmul.h"
#include "ops/matmul_bf16.h"
#include "ops/matmul_primitive.h"
#include "ops/precision.h"
#include "ops/small_gemm.h"
#include "ops/transpose.h"

using hlm::i64;

namespace {

hlm::aligned_vector<float> randn(size_t n, uint64_t seed, double scale) {
  hlm::Rng r(seed);
  hlm::aligned_vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal() * scale);
  return v;
}

// The GFLOP/s counter of a benchmark doing `flops` useful flops per iteration.
void set_gflops(benchmark::State& st, double flops) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// C[M,N] = op(A) op(B) in fp32 (row-major, dense strides).
void run_matmul(benchmark::State& st, bool ta, bool tb, i64 M, i64 N, i64 K) {
  auto A = randn(M * K, 1, 1.0), B = randn(N * K, 2, 1.0);
  hlm::aligned_vector<float> C(M * N);
  for (auto _ : st) {
    hlm::ops::matmul(ta, tb, M, N, K, 1.f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
  }
  set_gflops(st, 2.0 * M * N * K);
}

// y[M,N] = x[M,K] W[N,K]^T, the linear_forward layout.
void BM_Matmul(benchmark::State& st) { run_matmul(st, false, true, st.range(0), st.range(1), st.range(2)); }
BENCHMARK(BM_Matmul)->Args({8192, 768, 256})->Args({2048, 2048, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();
// The reproduce study's `small` model (d_model 128, d_ff 384, vocab 4096, 16 x 128 tokens a step), whose runs train
// on one thread each: run with OMP_NUM_THREADS=1 to see the per-core rate of its projections and LM head.
BENCHMARK(BM_Matmul)
    ->Args({2048, 768, 128})
    ->Args({2048, 128, 384})
    ->Args({2048, 512, 128})
    ->Args({2048, 4096, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Name("BM_MatmulStudySmall");

// The forward products with a narrow output (ops::narrow_forward_product) at the bench config's shapes, and a wide
// one for contrast, through dnnl_sgemm (path 0) and through oneDNN's fp32 matmul primitive (path 1), side by side
// whatever ops::matmul picks on this CPU. Args: path, M, N, K (y[M,N] = x[M,K] W[N,K]^T).
void BM_NarrowForward(benchmark::State& st) {
  const i64 M = st.range(1), N = st.range(2), K = st.range(3);
  auto A = randn(M * K, 1, 1.0), B = randn(N * K, 2, 1.0);
  hlm::aligned_vector<float> C(M * N);
  for (auto _ : st) {
    if (st.range(0) == 0)
      dnnl_sgemm('N', 'T', M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
    else
      hlm::ops::matmul_primitive("BM_NarrowForward", hlm::ops::MatmulType::f32, false, true, M, N, K, 1.f, A.data(),
                                 K, B.data(), K, 0.f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
  }
  set_gflops(st, 2.0 * M * N * K);
  if (st.range(0) == 1) st.SetLabel(hlm::ops::matmul_primitive_impl(hlm::ops::MatmulType::f32, false, true, M, N, K));
}
BENCHMARK(BM_NarrowForward)
    ->ArgNames({"path", "M", "N", "K"})
    ->ArgsProduct({{0, 1}, {8192}, {256}, {256, 512, 768}})
    ->Args({0, 8192, 1536, 256})
    ->Args({1, 8192, 1536, 256})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The chunked scans' products at the small study's heads (chunk 64, head_dim 32; Mamba-2's d_state 64): thousands of
// these per step, each too small for the GEMM to reach its peak (compare with BM_MatmulStudySmall).
BENCHMARK(BM_Matmul)
    ->Args({64, 64, 32})
    ->Args({64, 32, 64})
    ->Args({64, 64, 64})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->Name("BM_MatmulScanChunk");

// The scans' per-chunk products in every layout, through oneDNN's sgemm (impl 0) and through the register-blocked
// micro-kernel the scans use (impl 1, ops/small_gemm.h). Args: trans_a, trans_b, impl, M = N = K. Run with
// OMP_NUM_THREADS=1: the scans call them on one thread each.
void BM_SmallGemm(benchmark::State& st) {
  const bool ta = st.range(0) != 0, tb = st.range(1) != 0, small = st.range(2) != 0;
  const i64 n = st.range(3);
  auto A = randn(n * n, 1, 1.0), B = randn(n * n, 2, 1.0);
  hlm::aligned_vector<float> C(n * n);
  for (auto _ : st) {
    if (small)
      hlm::ops::small_gemm(ta, tb, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
    else
      hlm::ops::matmul(ta, tb, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
    benchmark::DoNotOptimize(C.data());
  }
  set_gflops(st, 2.0 * n * n * n);
}
BENCHMARK(BM_SmallGemm)
    ->ArgNames({"ta", "tb", "small", "n"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {32, 64}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The three products of each of the MLP's two linear layers y = x W^T (forward NT; backward dx = dy W, NN;
// dW += dy^T x, TN) at T tokens, d_model d and d_ff ff (gate|up fused: 2 ff outputs; then down). Args trans_a,
// trans_b, M, N, K.
void linear_layer_products(benchmark::internal::Benchmark* b, i64 T, i64 d, i64 ff) {
  b->ArgNames({"ta", "tb", "M", "N", "K"});
  for (auto [out, in] : {std::pair{2 * ff, d}, std::pair{d, ff}})
    b->Args({0, 1, T, out, in})->Args({0, 0, T, in, out})->Args({1, 0, out, in, T});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// fp32 at the study's small shapes (2048 tokens, d_model 128, d_ff 384).
void BM_MatmulLayout(benchmark::State& st) {
  run_matmul(st, st.range(0) != 0, st.range(1) != 0, st.range(2), st.range(3), st.range(4));
}
BENCHMARK(BM_MatmulLayout)->Apply([](benchmark::internal::Benchmark* b) {
  linear_layer_products(b, 2048, 128, 384);
});

// n standard normal values rounded to bf16.
hlm::aligned_vector<hlm::ops::bf16> randn_bf16(i64 n, uint64_t seed) {
  hlm::aligned_vector<hlm::ops::bf16> v(n);
  hlm::ops::round_to_bf16(randn(n, seed, 1.0).data(), 1, n, n, v.data());
  return v;
}

// C[M,N] = op(A) op(B) in bf16 x bf16 -> fp32, operands already rounded (row-major, dense strides).
// ldc: C's row stride (default N, dense).
void run_matmul_bf16(benchmark::State& st, bool ta, bool tb, i64 M, i64 N, i64 K, i64 ldc = 0) {
  if (!hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  if (ldc == 0) ldc = N;
  const auto A = randn_bf16(M * K, 1), B = randn_bf16(N * K, 2);
  hlm::aligned_vector<float> C(M * ldc);
  for (auto _ : st) {
    hlm::ops::matmul_bf16(ta, tb, M, N, K, 1.f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.f, C.data(), ldc);
    benchmark::DoNotOptimize(C.data());
  }
  set_gflops(st, 2.0 * M * N * K);
  st.SetLabel(hlm::ops::matmul_bf16_impl(ta, tb, M, N, K));
}

// bf16 at the BM_Matmul shapes and layout (the GEMM peak of --precision bf16).
void BM_MatmulBf16(benchmark::State& st) { run_matmul_bf16(st, false, true, st.range(0), st.range(1), st.range(2)); }
BENCHMARK(BM_MatmulBf16)->Args({8192, 768, 256})->Args({2048, 2048, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();

// The same products in bf16 at the bench config's shapes (8192 tokens, d_model 256, d_ff 768).
void BM_MatmulBf16Layout(benchmark::State& st) {
  run_matmul_bf16(st, st.range(0) != 0, st.range(1) != 0, st.range(2), st.range(3), st.range(4));
}
BENCHMARK(BM_MatmulBf16Layout)->Apply([](benchmark::internal::Benchmark* b) {
  linear_layer_products(b, 8192, 256, 768);
});

// The forward of the bench config's SwiGLU input projection (K = 256, N = 1536) at growing row counts, fp32 and bf16:
// with a short K each output element is written once per 2K flops, so past the last-level cache the fp32 output
// (50 MB at 8192 rows) and not the multiplier can bound a bf16 product (docs/precision.md).
void BM_MatmulOutputSize(benchmark::State& st) {
  const i64 M = st.range(1), N = 1536, K = 256;
  if (st.range(0) != 0)
    run_matmul_bf16(st, false, true, M, N, K);
  else
    run_matmul(st, false, true, M, N, K);
}
BENCHMARK(BM_MatmulOutputSize)
    ->ArgNames({"bf16", "M"})
    ->ArgsProduct({{0, 1}, {1024, 2048, 4096, 8192}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The bench config's Mamba-2 in-projection forward (N = 2 x 512 + 2 x 64 + 8 = 1160 rows of W, K = d_model 256) with
// its output rows dense (ldc 1160: every other row starts 32 bytes off a cache line) or padded to 1168 (every row
// 64-byte aligned).
void BM_MatmulBf16RowStride(benchmark::State& st) { run_matmul_bf16(st, false, true, 8192, 1160, 256, st.range(0)); }
BENCHMARK(BM_MatmulBf16RowStride)->ArgName("ldc")->Arg(1160)->Arg(1168)->Unit(benchmark::kMillisecond)->UseRealTime();

// A bf16 product threaded by oneDNN (split 0) or split by rows into one block per thread, each block a
// single-threaded oneDNN product inside one parallel region (split 1; blocks of 16 rows, so every block's output
// starts on a cache line), at the bench config's linear-layer shapes. Alone, warm, on Zen 4 (2 threads) the split
// ran most of the 8192-row products 1-15% faster (one 7% slower) and the weight gradients (K = 8192) within 7% either
// way; inside training steps the products ran at the same rates either way (docs/performance.md "bf16 products split
// by rows").
// Args: split, trans_b, M, N, K (C[M,N] = A[M,K] op(B), A in rows).
void BM_MatmulBf16RowSplit(benchmark::State& st) {
  if (!hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  const bool split = st.range(0) != 0, tb = st.range(1) != 0;
  const i64 M = st.range(2), N = st.range(3), K = st.range(4), ldb = tb ? K : N;
  const auto A = randn_bf16(M * K, 1), B = randn_bf16(N * K, 2);
  hlm::aligned_vector<float> C(M * N);
  auto rows = [&](i64 r0, i64 r1) {
    hlm::ops::matmul_bf16(false, tb, r1 - r0, N, K, 1.f, A.data() + r0 * K, K, B.data(), ldb, 0.f, C.data() + r0 * N,
                          N);
  };
  for (auto _ : st) {
    if (split)  // blocks of 16 rows, a contiguous run of them per thread
      hlm::parallel_for((M + 15) / 16, [&](i64 b, i64 e) { rows(16 * b, std::min(M, 16 * e)); });
    else
      rows(0, M);
    benchmark::DoNotOptimize(C.data());
  }
  set_gflops(st, 2.0 * M * N * K);
}
BENCHMARK(BM_MatmulBf16RowSplit)
    ->ArgNames({"split", "tb", "M", "N", "K"})
    ->ArgsProduct({{0, 1}, {1}, {8192}, {768, 1160, 1536}, {256}})
    ->ArgsProduct({{0, 1}, {0}, {8192}, {256}, {768, 1536}})
    ->ArgsProduct({{0, 1}, {0}, {256, 768}, {1536, 256}, {8192}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// linear_forward under bf16: rounding x and W to bf16 at every call, then the product (what a layer pays).
void BM_LinearBf16(benchmark::State& st) {
  if (!hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  const hlm::ops::PrecisionScope bf(hlm::ops::Precision::bf16, /*allow_emulated=*/true);
  const i64 M = st.range(0), N = st.range(1), K = st.range(2);
  auto x = randn(M * K, 1, 1.0), W = randn(N * K, 2, 1.0);
  hlm::aligned_vector<float> y(M * N);
  for (auto _ : st) {
    hlm::ops::linear_forward(x.data(), W.data(), y.data(), M, K, N);
    benchmark::DoNotOptimize(y.data());
  }
  set_gflops(st, 2.0 * M * N * K);
}
BENCHMARK(BM_LinearBf16)->Args({8192, 768, 256})->Args({2048, 2048, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();

// A linear layer's bf16 weight gradient, dW += dy^T x at 8192 tokens, with its operand rounding, in the two forms of
// ops::linear_backward_bf16 (arg transposed): 0, x rounded in rows and the product dy^T x (oneDNN's source
// transposed); 1, x rounded transposed, dW^T = x^T dy as a plain product, added transposed onto dW (what
// linear_backward does under bf16). dy arrives rounded (its rows also feed dx). Alone, with warm caches, the two forms
// are within a few percent; inside a training step the first ran at 0.8-0.95x the second's rate (Zen 4, AVX512_BF16;
// docs/precision.md).
void BM_WeightGradBf16(benchmark::State& st) {
  if (!hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  const bool transposed = st.range(0) != 0;
  const i64 N = 8192, out = st.range(1), in = st.range(2);
  const auto x = randn(N * in, 1, 1.0), dy = randn(N * out, 2, 1.0), W = randn(out * in, 3, 0.05);
  hlm::aligned_vector<hlm::ops::bf16> xb(N * in), dyb(N * out);
  hlm::ops::round_to_bf16(dy.data(), N, out, out, dyb.data());
  hlm::aligned_vector<float> dW(out * in, 0.f);
  for (auto _ : st) {
    if (transposed)
      hlm::ops::round_to_bf16_transposed(x.data(), N, in, in, xb.data());
    else
      hlm::ops::round_to_bf16(x.data(), N, in, in, xb.data());
    hlm::ops::linear_backward_bf16(xb.data(), W.data(), dyb.data(), nullptr, dW.data(), N, in, out,
                                   /*accumulate_dx=*/false, transposed);
    benchmark::DoNotOptimize(dW.data());
  }
  set_gflops(st, 2.0 * N * out * in);
}
BENCHMARK(BM_WeightGradBf16)
    ->ArgNames({"transposed", "out", "in"})
    ->ArgsProduct({{0, 1}, {1536, 768, 256}, {256}})
    ->Args({0, 256, 768})
    ->Args({1, 256, 768})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The LM head's operands, targets and outputs at N rows, d_model D, vocabulary V.
struct HeadCase {
  i64 N, D, V;
  hlm::aligned_vector<float> h, W, lse, dh, dW;
  hlm::aligned_vector<int32_t> tg;
  HeadCase(i64 N_, i64 D_, i64 V_)
      : N(N_), D(D_), V(V_), h(randn(N * D, 3, 1.0)), W(randn(V * D, 4, 0.05)), lse(N), dh(N * D), dW(V * D, 0.f),
        tg(N) {
    hlm::Rng r(5);
    for (auto& t : tg) t = static_cast<int32_t>(r.below(V));
  }
  double two_calls() {
    const double loss = hlm::ops::lm_head_ce_forward(h.data(), W.data(), tg.data(), N, D, V, lse.data());
    hlm::ops::lm_head_ce_backward(h.data(), W.data(), tg.data(), lse.data(), N, D, V, 1.f / N, dh.data(), dW.data());
    return loss;
  }
  double one_pass(const hlm::ops::CeTiling& tl) {
    return hlm::ops::lm_head_ce_forward_backward(h.data(), W.data(), tg.data(), N, D, V, 1.f / N, lse.data(), nullptr,
                                                 dh.data(), dW.data(), tl);
  }
};

// Args N, D, V, bf16 (0 = fp32, 1 = --precision bf16).
void BM_LmHeadCE(benchmark::State& st) {
  if (st.range(3) && !hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  const hlm::ops::PrecisionScope prec(st.range(3) ? hlm::ops::Precision::bf16 : hlm::ops::Precision::fp32, true);
  HeadCase c(st.range(0), st.range(1), st.range(2));
  for (auto _ : st) benchmark::DoNotOptimize(c.two_calls());
  set_gflops(st, 8.0 * c.N * c.D * c.V);
}
BENCHMARK(BM_LmHeadCE)->Args({8192, 256, 4096, 0})->Args({8192, 256, 4096, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// A training step's head: lm_head_ce_forward_backward (one pass, three products) against the two calls above (four
// products: the backward recomputes the logits). Args N, D, V, bf16, rows: the fused row block (0 = its default),
// or -1 for the two calls. GFLOP/s counts the useful 6 N D V of either, so the two are compared by it directly.
void BM_LmHeadCEStep(benchmark::State& st) {
  if (st.range(3) && !hlm::ops::bf16_matmul_available()) return st.SkipWithError("no bf16 matmul on this CPU");
  const hlm::ops::PrecisionScope prec(st.range(3) ? hlm::ops::Precision::bf16 : hlm::ops::Precision::fp32, true);
  HeadCase c(st.range(0), st.range(1), st.range(2));
  const i64 rows = st.range(4);
  hlm::ops::CeTiling tl;
  tl.fused_rows = std::max<i64>(0, rows);
  for (auto _ : st) benchmark::DoNotOptimize(rows < 0 ? c.two_calls() : c.one_pass(tl));
  set_gflops(st, 6.0 * c.N * c.D * c.V);
}
// The bench config's head (8192 tokens, d_model 256) and the small study's (2048 tokens, d_model 128), vocab 4096.
BENCHMARK(BM_LmHeadCEStep)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "D", "V", "bf16", "rows"});
  for (auto [N, D] : {std::pair<i64, i64>{8192, 256}, {2048, 128}})
    for (i64 rows : {-1, 0, 32, 64, 128}) b->Args({N, D, 4096, 0, rows});
  b->Args({8192, 256, 4096, 1, -1})->Args({8192, 256, 4096, 1, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
});

}  // namespace
