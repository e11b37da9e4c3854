#pragma once
// bf16 x bf16 -> fp32 matmul through oneDNN's matmul primitive (AVX512_BF16 / AMX kernels where the CPU has them),
// and the fp32 -> bf16 rounding that feeds it. Used by ops::linear_* and the LM head when ops::precision() is bf16.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

using bf16 = std::uint16_t;  // the upper half of an fp32: sign, 8 exponent bits, 7 mantissa bits

// Round to nearest, ties to even (NaN stays NaN); |bf16(x) - x| <= 2^-8 |x| for normal x.
inline bf16 to_bf16(float x) {
  std::uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(nan ? (u >> 16) | 0x40u : rounded >> 16);
}
inline float from_bf16(bf16 h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x;
  __builtin_memcpy(&x, &u, 4);
  return x;
}

// dst[r * cols + c] = to_bf16(src[r * ld_src + c]) for r < rows, c < cols (dense destination). Parallel over
// rows when called outside a parallel region.
void round_to_bf16(const float* src, i64 rows, i64 cols, i64 ld_src, bf16* dst);

// C[M,N] = alpha * op(A) op(B) + beta * C with A, B in bf16 and C in fp32; products accumulate in fp32. Same
// shapes and strides as ops::matmul (row-major; lda/ldb/ldc are row strides of the stored matrices). Safe to
// call from several threads at once (each runs single-threaded inside a parallel region, as dnnl_sgemm does).
void matmul_bf16(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const bf16* A, i64 lda,
                 const bf16* B, i64 ldb, float beta, float* C, i64 ldc);

// The same with C in bf16: C = alpha op(A) op(B), accumulated in fp32 and rounded to bf16 by oneDNN as it is written
// (nearest, ties to even), for a product that only a bf16 reader consumes (the bf16 step's MLP gate|up, which SwiGLU
// reads). K must be positive.
void matmul_bf16_out(bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha, const bf16* A, i64 lda,
                     const bf16* B, i64 ldb, bf16* C, i64 ldc);

// oneDNN's name for the implementation it picked for this shape (e.g. "brg:avx512_core_bf16"), for benchmarks.
const char* matmul_bf16_impl(bool trans_a, bool trans_b, i64 M, i64 N, i64 K);

}  // namespace hlm::ops
