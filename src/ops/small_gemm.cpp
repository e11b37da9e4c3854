// Small fp32 products on the register-blocked micro-kernel (ops/small_gemm.h), written once with Google Highway and
// dispatched per SIMD target at run time (docs/performance.md).
//
// The micro-kernel broadcasts elements of op(A), so A is read in place whether transposed or not, and loads rows of
// op(B) as vectors. op(B) goes in panels of up to 64 columns: B itself when not transposed, else a transposed copy
// on the stack (K x 64 floats, 32 KB at most), with alpha folded in. Each panel meets every 4-row block of op(A) while
// it is in L1. C is written directly when beta is 0 or 1 and alpha is 1 or folded into the copy (the scans' products
// but one); other alpha and beta go through a 4-row staging block. Both buffers live on the stack, so the op keeps no
// scratch between calls.
#include "ops/small_gemm.h"

#include <algorithm>

#include "core/error.h"
#include "core/simd_target.h"
#include "ops/matmul.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/small_gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/microkernel-inl.h"

// GCC 12's AVX-512 masked-load intrinsics (the transposed copy) start from _mm512_undefined_ps(): a false
// -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {

constexpr i64 kPanel = 64;  // op(B) columns per panel (the micro-kernel splits them into its passes)

void small_gemm_impl(bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B,
                     i64 ldb, float beta, float* C, i64 ldc) {
  const i64 a_rs = ta ? 1 : lda, a_ks = ta ? lda : 1;  // op(A)(i, k) = A[i * a_rs + k * a_ks]
  const float alpha_after = tb ? 1.f : alpha;  // what is left of alpha once the product is made
  const bool direct = alpha_after == 1.f && (beta == 0.f || beta == 1.f);
  alignas(64) float panel[kSmallGemmMax * kPanel];
  alignas(64) float stage[4 * kPanel];
  const micro::DF d;
  const auto va = hn::Set(d, alpha_after), vb = hn::Set(d, beta);
  for (i64 j0 = 0; j0 < N; j0 += kPanel) {
    const i64 np = std::min(kPanel, N - j0);
    const float* Bp = B + j0;  // op(B)[:, j0 .. j0 + np)
    i64 ldbp = ldb;
    if (tb) {
      micro::transpose_rows(B + j0 * ldb, ldb, np, np, K, alpha, panel, kPanel);
      Bp = panel, ldbp = kPanel;
    }
    for (i64 r0 = 0; r0 < M; r0 += 4) {
      const int mr = static_cast<int>(std::min<i64>(4, M - r0));
      float* c = C + r0 * ldc + j0;
      if (direct) {
        micro::block(mr, np, K, A + r0 * a_rs, a_rs, a_ks, Bp, ldbp, c, ldc, beta == 1.f);
        continue;
      }
      micro::block(mr, np, K, A + r0 * a_rs, a_rs, a_ks, Bp, ldbp, stage, kPanel, false);
      for (int r = 0; r < mr; ++r)
        for_each_vector(d, np, [&](i64 j, size_t n) {
          const auto ab = hn::Mul(va, load_part(d, stage + r * kPanel + j, n));
          float* cj = c + r * ldc + j;
          store_part(d, beta == 0.f ? ab : hn::MulAdd(vb, load_part(d, cj, n), ab), cj, n);
        });
    }
  }
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(small_gemm_impl);

void small_gemm(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B,
                i64 ldb, float beta, float* C, i64 ldc) {
  if (!matmul_needs_product("small_gemm", trans_a, trans_b, M, N, K, lda, ldb, beta, C, ldc)) return;
  HLM_CHECK(small_gemm_fits(M, N, K), "small_gemm: M={} N={} K={} has a side above {}", M, N, K, kSmallGemmMax);
  init_simd();
  HWY_DYNAMIC_DISPATCH(small_gemm_impl)(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
