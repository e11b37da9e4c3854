#pragma once
// fp32 matmul through oneDNN (dnnl_sgemm: AVX-512 JIT kernels, OpenMP inside; the narrow forward products below
// through oneDNN's matmul primitive, ops/matmul_primitive.h).
// Row-major everywhere. Weights follow nn.Linear: W is [out, in], y = x W^T.
// linear_forward / linear_backward follow ops::precision() (ops/precision.h): under bf16 their operands are
// rounded to bf16 and multiplied by ops::matmul_bf16 with fp32 accumulation; `matmul` itself is always fp32.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// C[M,N] = alpha * op(A) op(B) + beta * C; op(A) is [M,K], op(B) is [K,N]; lda/ldb/ldc are row strides.
void matmul(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
            const float* B, i64 ldb, float beta, float* C, i64 ldc);

// Whether matmul() runs this product on oneDNN's matmul primitive instead of dnnl_sgemm: C = A B^T with few output
// columns from at least as many inputs (N <= 512, K >= max(N, 256), M >= 1024: the attention output and MLP down
// projections' forward at the bench config), where dnnl_sgemm ran 5-30% slower on Zen 4 and Ice Lake
// (docs/performance.md "Narrow forward products"). Only where oneDNN runs AVX-512 (its brgemm kernels); off with
// HLM_SGEMM_ONLY=1 in the environment. Depends on the shape and the CPU alone, so results do not change between calls.
bool narrow_forward_product(bool trans_a, bool trans_b, i64 M, i64 N, i64 K);

// The checks of a matmul's sizes and strides (errors name `op`) and its empty cases: false when nothing is left to
// multiply (M, N or K is 0; with K == 0, C = beta C, and beta == 0 overwrites even NaN).
bool matmul_needs_product(const char* op, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, i64 lda, i64 ldb,
                          float beta, float* C, i64 ldc);

// y[N,out] = x[N,in] W[out,in]^T   (y overwritten; its rows ldy apart, 0 = out: dense)
void linear_forward(const float* x, const float* W, float* y, i64 N, i64 in, i64 out, i64 ldy = 0);
// dx[N,in] = dy[N,out] W  (overwritten, or added when accumulate_dx; skipped if dx == nullptr)
// dW[out,in] += dy^T x    (parameter gradients accumulate)
// dy's rows are lddy apart (0 = out: dense).
void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, i64 N,
                     i64 in, i64 out, bool accumulate_dx = false, i64 lddy = 0);

// The same under bf16 with activations a kernel already wrote rounded (dense rows, ops::to_bf16, e.g. by
// ops::swiglu_forward_bf16): xb stands for x, dyb for dy. Bit for bit what linear_* give under bf16 for the fp32
// values they were rounded from. Call only when ops::precision() is bf16.
using bf16 = std::uint16_t;
void linear_forward_bf16(const bf16* xb, const float* W, float* y, i64 N, i64 in, i64 out, i64 ldy = 0);
// y[N,out] = x[N,in] W[out,in]^T under bf16 with y rounded to bf16 (dense rows; ops::matmul_bf16_out), for a
// product that only a bf16 reader consumes: the MLP's gate|up, read by ops::swiglu_*_bf16. Call only under bf16.
void linear_forward_to_bf16(const float* x, const float* W, bf16* y, i64 N, i64 in, i64 out);
// dx from dyb when dx is given (xb may be null then); dW from xb and dyb when dW is given. A caller rounds an fp32
// operand itself with ops::round_to_bf16 (ops/matmul_bf16.h), e.g. once for a dy that feeds two calls. xb holds x's
// rows [N, in], or with xb_transposed its transpose [in, N] (ops::round_to_bf16_transposed, ops/transpose.h): the
// faster weight gradient, and the form linear_backward takes under bf16 (so its bits are those of that form).
void linear_backward_bf16(const bf16* xb, const float* W, const bf16* dyb, float* dx, float* dW, i64 N, i64 in,
                          i64 out, bool accumulate_dx = false, bool xb_transposed = false);

}  // namespace hlm::ops
