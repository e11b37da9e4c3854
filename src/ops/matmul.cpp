#include "ops/matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

#include "core/error.h"

namespace hlm::ops {

void matmul(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
            const float* B, i64 ldb, float beta, float* C, i64 ldc) {
  HLM_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul: negative size M={} N={} K={}", M, N, K);
  // Row strides must cover a row of the stored (untransposed) matrix.
  const i64 a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  HLM_CHECK(lda >= std::max<i64>(1, a_cols) && ldb >= std::max<i64>(1, b_cols) && ldc >= std::max<i64>(1, N),
            "matmul: bad strides lda={} ldb={} ldc={} for M={} N={} K={} trans_a={} trans_b={}", lda, ldb, ldc,
            M, N, K, trans_a, trans_b);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // Nothing to multiply; only the beta scaling of C (beta == 0 overwrites, even NaN).
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                                C, ldc);
  HLM_CHECK(st == dnnl_success, "matmul: dnnl_sgemm failed (status {}) for M={} N={} K={} trans_a={} trans_b={}",
            static_cast<int>(st), M, N, K, trans_a, trans_b);
}

void linear_forward(const float* x, const float* W, float* y, i64 N, i64 in, i64 out) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_forward: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  // y[N,out] = x[N,in] W[out,in]^T
  matmul(false, true, N, out, in, 1.f, x, in, W, in, 0.f, y, out);
}

void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, i64 N, i64 in,
                     i64 out, bool accumulate_dx) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_backward: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  // dx[N,in] = dy[N,out] W[out,in]
  if (dx) matmul(false, false, N, in, out, 1.f, dy, out, W, in, accumulate_dx ? 1.f : 0.f, dx, in);
  // dW[out,in] += dy[N,out]^T x[N,in]
  if (dW) matmul(true, false, out, in, N, 1.f, dy, out, x, in, 1.f, dW, in);
}

}  // namespace hlm::ops
