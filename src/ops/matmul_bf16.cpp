#include "ops/matmul_bf16.h"

#include "core/error.h"
#include "core/parallel.h"
#include "ops/matmul.h"
#include "ops/matmul_primitive.h"

namespace hlm::ops {

void round_to_bf16(const float* src, i64 rows, i64 cols, i64 ld_src, bf16* dst) {
  auto rows_fn = [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const float* s = src + r * ld_src;
      bf16* d = dst + r * cols;
#pragma omp simd
      for (i64 c = 0; c < cols; ++c) d[c] = to_bf16(s[c]);
    }
  };
  if (rows * cols < (1 << 16)) rows_fn(0, rows);
  else parallel_for(rows, rows_fn);  // serial inside a parallel region (the LM head's tiles)
}

void matmul_bf16(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const bf16* A, i64 lda,
                 const bf16* B, i64 ldb, float beta, float* C, i64 ldc) {
  if (!matmul_needs_product("matmul_bf16", trans_a, trans_b, M, N, K, lda, ldb, beta, C, ldc)) return;
  matmul_primitive("matmul_bf16", MatmulType::bf16, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_bf16_out(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const bf16* A, i64 lda,
                     const bf16* B, i64 ldb, bf16* C, i64 ldc) {
  HLM_CHECK(K > 0, "matmul_bf16_out: K must be positive (M={} N={} K={})", M, N, K);
  // With K > 0 the checks leave C alone (the fp32 C they take is only written when K == 0).
  if (!matmul_needs_product("matmul_bf16_out", trans_a, trans_b, M, N, K, lda, ldb, 0.f, nullptr, ldc)) return;
  matmul_primitive("matmul_bf16_out", MatmulType::bf16_out, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.f, C,
                   ldc);
}

const char* matmul_bf16_impl(bool trans_a, bool trans_b, i64 M, i64 N, i64 K) {
  return matmul_primitive_impl(MatmulType::bf16, trans_a, trans_b, M, N, K);
}

}  // namespace hlm::ops
