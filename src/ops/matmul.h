#pragma once
// fp32 matmul through oneDNN (dnnl_sgemm: AVX-512 JIT kernels, OpenMP inside).
// Row-major everywhere. Weights follow nn.Linear: W is [out, in], y = x W^T.
#include "core/tensor.h"

namespace hlm::ops {

// C[M,N] = alpha * op(A) op(B) + beta * C; op(A) is [M,K], op(B) is [K,N]; lda/ldb/ldc are row strides.
void matmul(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
            const float* B, i64 ldb, float beta, float* C, i64 ldc);

// y[N,out] = x[N,in] W[out,in]^T   (y overwritten)
void linear_forward(const float* x, const float* W, float* y, i64 N, i64 in, i64 out);
// dx[N,in] = dy[N,out] W  (overwritten, or added when accumulate_dx; skipped if dx == nullptr)
// dW[out,in] += dy^T x    (parameter gradients accumulate)
void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, i64 N,
                     i64 in, i64 out, bool accumulate_dx = false);

}  // namespace hlm::ops
