#pragma once
// Elementwise pieces of the chunked scans (ops/scalar_decay_scan.cpp, ops/gated_delta.cpp) that are not matmuls,
// written once with Google Highway and dispatched per SIMD target at run time (docs/performance.md), so a
// portable build runs them with the CPU's vectors too. The matmuls around them go to oneDNN.
#include "core/tensor.h"

namespace hlm::ops {

// x[i] = e^x[i] for i < n (the vector exp of ops/simd_math-inl.h, ~2 ulp; -inf and x < -87.3 give 0).
void exp_inplace_simd(float* x, i64 n);

// The unit lower triangular T = (I + M)^-1 by forward substitution, row by row, with M_im = beta_i A_im Gamma_im
// for m < i:  T_ij = -sum_{m=j}^{i-1} M_im T_mj (j < i), T_ii = 1, T_ij = 0 (i < j < C).
// A, Gamma, T: [L, C] row-major, C a multiple of 16. Row m of T is zero right of its diagonal, so for columns
// [jb, jb+16) only m >= jb contribute; each 16-wide block is accumulated in registers, every entry summing
// over m in order (the result does not depend on the target's vector width).
void unit_lower_inverse(const float* A, const float* Gamma, const float* beta, float* T, i64 L, i64 C);
void unit_lower_inverse(const double* A, const double* Gamma, const double* beta, double* T, i64 L, i64 C);

}  // namespace hlm::ops
