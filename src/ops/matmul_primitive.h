#pragma once
// Matmuls through oneDNN's matmul primitive (its brgemm kernels), one primitive per shape kept for the process:
// the bf16 products of ops::matmul_bf16, and the fp32 products for which the primitive beats dnnl_sgemm
// (ops::matmul; docs/performance.md "Narrow forward products").
#include "core/tensor.h"

namespace hlm::ops {

// The type of A and B; C is fp32, except for bf16_out: bf16 A and B, and C rounded to bf16 by oneDNN (nearest, ties
// to even) as it is written.
enum class MatmulType { f32, bf16, bf16_out };

// C[M,N] = alpha * op(A) op(B) + beta * C, the shapes and strides of ops::matmul, A, B and C of `type`. Safe to
// call from several threads at once (each runs single-threaded inside a parallel region). Throws hlm::Error naming
// `op` when oneDNN has no kernel for the shape on this CPU.
void matmul_primitive(const char* op, MatmulType type, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha,
                      const void* A, i64 lda, const void* B, i64 ldb, float beta, void* C, i64 ldc);

// oneDNN's name for the implementation it picks for a dense product of this shape (e.g. "brg:avx512_core_bf16").
const char* matmul_primitive_impl(MatmulType type, bool trans_a, bool trans_b, i64 M, i64 N, i64 K);

}  // namespace hlm::ops
