#pragma once
// Elementwise pieces of the chunked scans (ops/scalar_decay_scan.cpp, ops/gated_delta.cpp) that are not matmuls,
// written once with Google Highway and dispatched per SIMD target at run time (docs/performance.md), so a
// portable build runs them with the CPU's vectors too. The matmuls around them go to oneDNN.
#include <cmath>

#include "core/tensor.h"

namespace hlm::ops {

// x[i] = e^x[i] for i < n (the vector exp of ops/simd_math-inl.h, ~2 ulp; -inf and x < -87.3 give 0).
void exp_inplace_simd(float* x, i64 n);

// exp over an array in the scans' element type: the dispatched vector exp for float (masked entries are -inf and
// give exactly 0), std::exp for double (the double paths are the tests' references).
inline void exp_inplace(float* x, i64 n) { exp_inplace_simd(x, n); }
inline void exp_inplace(double* x, i64 n) {
  for (i64 i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

// The unit lower triangular T = (I + M)^-1 by forward substitution, row by row, with M_im = beta_i A_im Gamma_im
// for m < i:  T_ij = -sum_{m=j}^{i-1} M_im T_mj (j < i), T_ii = 1, T_ij = 0 (i < j < C).
// A, Gamma, T: [L, C] row-major, C a multiple of 16. Row m of T is zero right of its diagonal, so for columns
// [jb, jb+16) only m >= jb contribute; each 16-wide block is accumulated in registers, every entry summing
// over m in order (the result does not depend on the target's vector width).
void unit_lower_inverse(const float* A, const float* Gamma, const float* beta, float* T, i64 L, i64 C);
void unit_lower_inverse(const double* A, const double* Gamma, const double* beta, double* T, i64 L, i64 C);

// ---- row operations of the chunked scans' non-matmul steps (each call covers a whole chunk or state block) ----
// Rows are m rows of n elements, row i at src + i * lds / dst + i * ldd. Declared for float and double.

// y[i] += a x[i] for i < n (the carried state between chunks, and its gradient in the reverse scan).
void axpy(float a, const float* x, float* y, i64 n);
void axpy(double a, const double* x, double* y, i64 n);

// y[i] *= x[i] for i < n.
void mul_inplace(float* y, const float* x, i64 n);
void mul_inplace(double* y, const double* x, i64 n);

// dst row i = (s0 * s[i]) * src row i; s == nullptr scales by s0 alone. dst may be src (then ldd == lds).
void scale_rows(float s0, const float* s, const float* src, i64 lds, float* dst, i64 ldd, i64 m, i64 n);
void scale_rows(double s0, const double* s, const double* src, i64 lds, double* dst, i64 ldd, i64 m, i64 n);

// dst row i += s[i] * src row i.
void axpy_rows(const float* s, const float* src, i64 lds, float* dst, i64 ldd, i64 m, i64 n);
void axpy_rows(const double* s, const double* src, i64 lds, double* dst, i64 ldd, i64 m, i64 n);

// The causal band of an elementwise product on [L, L] blocks of row stride ld: out_ij = a_ij * b_ij for j <= i and
// 0 for i < j < L. out may be a.
void lower_product(const float* a, const float* b, float* out, i64 L, i64 ld);
void lower_product(const double* a, const double* b, double* out, i64 L, i64 ld);

// The scalar-decay scan's intra-chunk pass over P = A .* Gamma ([n, n], row-major): for j < i,
// x = dP_ij Gamma_ij, dPG_ij += x and R_ij = x A_ij; dPG_ii += dP_ii; then dgam_i += rowsum_i(R) - colsum_i(R)
// (the row sums in Real, added to dgam in double). colsum: n elements of scratch.
void decay_band_grads(const float* dP, const float* Gm, const float* A, float* dPG, float* colsum, double* dgam,
                      i64 n);
void decay_band_grads(const double* dP, const double* Gm, const double* A, double* dPG, double* colsum, double* dgam,
                      i64 n);

// Gated DeltaNet's dA0 pass ([L, L] blocks of row stride ld, strictly lower part): dA0_ij = dM_ij Gamma_ij,
// dbt_i = sum_j dA0_ij A_ij, Z_ij += (dA0_ij bt_i) A_ij, B_ij = bt_i dA0_ij; B_ii = 0.
void delta_a0_grads(const float* dM, const float* Gm, const float* A, const float* bt, float* Z, float* B, float* dbt,
                    i64 L, i64 ld);
void delta_a0_grads(const double* dM, const double* Gm, const double* A, const double* bt, double* Z, double* B,
                    double* dbt, i64 L, i64 ld);

// dgam_j -= Z_ij and dgam_i += sum_{j<i} Z_ij over the strictly lower part of Z ([L, L], row stride ld), row by row.
void lower_row_minus_col_sums(const float* Z, float* dgam, i64 L, i64 ld);
void lower_row_minus_col_sums(const double* Z, double* dgam, i64 L, i64 ld);

// ---- the linear mixers' recurrent token step (decoding), on one head's state S [K, V] (row-major) ----
// Each reads S once, in vector blocks of columns with their sums in registers (declared for float and double).

// Sx = S^T x and, when y != nullptr, Sy = S^T y (x, y: K elements; Sx, Sy: V).
void state_transpose_products(const float* S, i64 K, i64 V, const float* x, const float* y, float* Sx, float* Sy);
void state_transpose_products(const double* S, i64 K, i64 V, const double* x, const double* y, double* Sx,
                              double* Sy);

// S = a S + x u^T (x: K, u: V; a == 0 overwrites S, whatever it held), then, when q != nullptr, o = qs S^T q read
// from the updated S in the same pass (q: K, o: V).
void state_decay_rank1(float* S, i64 K, i64 V, float a, const float* x, const float* u, float qs, const float* q,
                       float* o);
void state_decay_rank1(double* S, i64 K, i64 V, double a, const double* x, const double* u, double qs,
                       const double* q, double* o);

}  // namespace hlm::ops
