#pragma once
// The small dense products the scan kernels (ops/scalar_decay_scan.cpp, ops/gated_delta.cpp) are built from, for
// both element types they are instantiated with: float, the engine, goes to the register-blocked micro-kernel
// (ops/small_gemm.h; on the calling thread, inside the kernels' parallel regions) and, for a side above its limit,
// to oneDNN's sgemm (ops/matmul.h), or under --precision bf16 on CPUs with AVX512_BF16 to the bf16 pair products
// (ops/bf16_pairs.h: oneDNN's bf16 matmul is slower than its sgemm at these 64 x 64 sizes); double, the test oracle,
// runs plain loops.
#include "core/tensor.h"
#include "ops/bf16_pairs.h"
#include "ops/matmul.h"
#include "ops/small_gemm.h"

namespace hlm::ops {

// Row-major C[M,N] = alpha op(A) op(B) + beta C; lda, ldb, ldc are row strides.
inline void gemm(bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B, i64 ldb,
                 float beta, float* C, i64 ldc) {
  if (bf16_pairs::active())
    bf16_pairs::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (small_gemm_fits(M, N, K))
    small_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    matmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, i64 M, i64 N, i64 K, double alpha, const double* A, i64 lda, const double* B,
                 i64 ldb, double beta, double* C, i64 ldc) {
  for (i64 i = 0; i < M; ++i) {
    double* c = C + i * ldc;
    for (i64 j = 0; j < N; ++j) c[j] = beta == 0 ? 0.0 : beta * c[j];
    for (i64 p = 0; p < K; ++p) {
      const double av = alpha * (ta ? A[p * lda + i] : A[i * lda + p]);
      if (tb)
        for (i64 j = 0; j < N; ++j) c[j] += av * B[j * ldb + p];
      else
        for (i64 j = 0; j < N; ++j) c[j] += av * B[p * ldb + j];
    }
  }
}

// Vectorised (fixed lane order, so still deterministic); a strict left-to-right float sum would not vectorise.
template <typename Real>
inline Real dot(const Real* a, const Real* b, i64 n) {
  Real s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace hlm::ops
