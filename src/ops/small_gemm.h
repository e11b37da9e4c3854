#pragma once
// fp32 products small enough to stay in the first cache levels (the chunked scans' per-chunk products: 64 x 64 x 64
// at the bench config, thousands per step, each on one thread), on the register-blocked micro-kernel of the attention
// kernels (ops/microkernel-inl.h). oneDNN's sgemm spends much of such a call outside its kernel: on one Ice Lake
// core it ran A B^T at 64 x 64 x 64 at 45 GFLOP/s, A^T B at 76 and A B at 86-100 (docs/performance.md).
#include "core/tensor.h"

namespace hlm::ops {

// The largest M, N and K small_gemm takes (a transposed op(B) is copied to the stack in panels of K x 64 floats).
constexpr i64 kSmallGemmMax = 128;

// Whether small_gemm takes this shape (every side at most kSmallGemmMax).
inline bool small_gemm_fits(i64 M, i64 N, i64 K) {
  return M <= kSmallGemmMax && N <= kSmallGemmMax && K <= kSmallGemmMax;
}

// Row-major C[M,N] = alpha op(A) op(B) + beta C, as ops::matmul (the same checks and empty cases), on the calling
// thread. beta == 0 overwrites C, NaN included.
void small_gemm(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B,
                i64 ldb, float beta, float* C, i64 ldc);

}  // namespace hlm::ops
