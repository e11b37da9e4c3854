#include "ops/matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "ops/kernel_args.h"
#include "ops/matmul_bf16.h"
#include "ops/matmul_primitive.h"
#include "ops/precision.h"
#include "ops/transpose.h"

namespace hlm::ops {

bool matmul_needs_product(const char* op, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, i64 lda, i64 ldb,
                          float beta, float* C, i64 ldc) {
  HLM_CHECK(M >= 0 && N >= 0 && K >= 0, "{}: negative size M={} N={} K={}", op, M, N, K);
  // Row strides must cover a row of the stored (untransposed) matrix.
  const i64 a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  HLM_CHECK(lda >= std::max<i64>(1, a_cols) && ldb >= std::max<i64>(1, b_cols) && ldc >= std::max<i64>(1, N),
            "{}: bad strides lda={} ldb={} ldc={} for M={} N={} K={} trans_a={} trans_b={}", op, lda, ldb, ldc, M, N,
            K, trans_a, trans_b);
  if (M == 0 || N == 0) return false;
  if (K == 0) {
    // Nothing to multiply; only the beta scaling of C (beta == 0 overwrites, even NaN).
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return false;
  }
  return true;
}

namespace {
// HLM_SGEMM_ONLY=1 in the environment: every fp32 product through dnnl_sgemm (A/B runs, and
// libhlm_sgemm_profile.so, which sees only dnnl_sgemm).
bool sgemm_only() {
  static const bool only = [] {
    const char* v = std::getenv("HLM_SGEMM_ONLY");
    return v && std::strcmp(v, "1") == 0;
  }();
  return only;
}

// The primitive's fp32 brgemm kernels need AVX-512 (oneDNN's effective ISA: ONEDNN_MAX_CPU_ISA caps it); below that
// it would run the same JIT GEMM as dnnl_sgemm.
bool avx512_matmul() {
  static const bool on = [] {
    const unsigned isa = dnnl_get_effective_cpu_isa(), avx512 = dnnl_cpu_isa_avx512_core;
    return (isa & avx512) == avx512;
  }();
  return on;
}
}  // namespace

bool narrow_forward_product(bool trans_a, bool trans_b, i64 M, i64 N, i64 K) {
  return !trans_a && trans_b && M >= 1024 && N <= 512 && K >= 256 && K >= N && avx512_matmul() && !sgemm_only();
}

void matmul(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
            const float* B, i64 ldb, float beta, float* C, i64 ldc) {
  if (!matmul_needs_product("matmul", trans_a, trans_b, M, N, K, lda, ldb, beta, C, ldc)) return;
  if (narrow_forward_product(trans_a, trans_b, M, N, K)) {
    matmul_primitive("matmul", MatmulType::f32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                                C, ldc);
  HLM_CHECK(st == dnnl_success, "matmul: dnnl_sgemm failed (status {}) for M={} N={} K={} trans_a={} trans_b={}",
            static_cast<int>(st), M, N, K, trans_a, trans_b);
}

namespace {
// bf16 copies of a linear layer's operands, one buffer per role, kept per thread and only grown (64-byte aligned, so
// oneDNN takes the same path every run): they are rounded afresh at every call (weights change every step; rounding
// costs 1/(2 out) of the product for x, 1/(2 N) for W).
enum Slot { kSlotX, kSlotW, kSlotDy, kSlots };
aligned_vector<bf16>& slot_buffer(Slot slot, i64 size) {
  thread_local aligned_vector<bf16> buf[kSlots];
  aligned_vector<bf16>& b = buf[slot];
  if (b.size() < static_cast<size_t>(size)) b.resize(static_cast<size_t>(size));
  return b;
}
const bf16* rounded(const float* src, i64 rows, i64 cols, Slot slot, i64 ld_src = 0) {  // ld_src 0: dense
  bf16* b = slot_buffer(slot, rows * cols).data();
  round_to_bf16(src, rows, cols, stride_or(ld_src, cols), b);
  return b;
}
const bf16* rounded_transposed(const float* src, i64 rows, i64 cols, Slot slot) {  // [cols, rows]
  bf16* b = slot_buffer(slot, rows * cols).data();
  round_to_bf16_transposed(src, rows, cols, cols, b);
  return b;
}
}  // namespace

void linear_forward_bf16(const bf16* xb, const float* W, float* y, i64 N, i64 in, i64 out, i64 ldy) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_forward_bf16: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  if (N > 0)
    matmul_bf16(false, true, N, out, in, 1.f, xb, in, rounded(W, out, in, kSlotW), in, 0.f, y, stride_or(ldy, out));
}

void linear_forward_to_bf16(const float* x, const float* W, bf16* y, i64 N, i64 in, i64 out) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_forward_to_bf16: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  if (N > 0)
    matmul_bf16_out(false, true, N, out, in, 1.f, rounded(x, N, in, kSlotX), in, rounded(W, out, in, kSlotW), in, y,
                    out);
}

void linear_backward_bf16(const bf16* xb, const float* W, const bf16* dyb, float* dx, float* dW, i64 N, i64 in,
                          i64 out, bool accumulate_dx, bool xb_transposed) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_backward_bf16: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  if (N == 0) return;
  if (dx)
    matmul_bf16(false, false, N, in, out, 1.f, dyb, out, rounded(W, out, in, kSlotW), in, accumulate_dx ? 1.f : 0.f,
                dx, in);
  if (!dW) return;
  if (!xb_transposed) {
    matmul_bf16(true, false, out, in, N, 1.f, dyb, out, xb, in, 1.f, dW, in);
    return;
  }
  // dW^T[in, out] = x^T dy, both operands in plain rows (ops/transpose.h), then added transposed onto dW.
  thread_local aligned_vector<float> dWt;
  if (dWt.size() < static_cast<size_t>(in * out)) dWt.resize(static_cast<size_t>(in * out));
  matmul_bf16(false, false, in, out, N, 1.f, xb, N, dyb, out, 0.f, dWt.data(), out);
  add_transposed(dWt.data(), in, out, dW);
}

void linear_forward(const float* x, const float* W, float* y, i64 N, i64 in, i64 out, i64 ldy) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_forward: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  if (precision() == Precision::bf16 && N > 0) {
    linear_forward_bf16(rounded(x, N, in, kSlotX), W, y, N, in, out, ldy);
    return;
  }
  // y[N,out] = x[N,in] W[out,in]^T
  matmul(false, true, N, out, in, 1.f, x, in, W, in, 0.f, y, stride_or(ldy, out));
}

void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, i64 N, i64 in,
                     i64 out, bool accumulate_dx, i64 lddy) {
  HLM_CHECK(N >= 0 && in > 0 && out > 0, "linear_backward: bad shape x[{}, {}] W[{}, {}]", N, in, out, in);
  lddy = stride_or(lddy, out);
  if (precision() == Precision::bf16 && N > 0) {
    // dy rounded into dense rows (the bf16 copy drops any row padding).
    linear_backward_bf16(dW ? rounded_transposed(x, N, in, kSlotX) : nullptr, W, rounded(dy, N, out, kSlotDy, lddy),
                         dx, dW, N, in, out, accumulate_dx, /*xb_transposed=*/true);
    return;
  }
  // dx[N,in] = dy[N,out] W
  if (dx) matmul(false, false, N, in, out, 1.f, dy, lddy, W, in, accumulate_dx ? 1.f : 0.f, dx, in);
  // dW[out,in] += dy[N,out]^T x
  if (dW) matmul(true, false, out, in, N, 1.f, dy, lddy, x, in, 1.f, dW, in);
}

}  // namespace hlm::ops
