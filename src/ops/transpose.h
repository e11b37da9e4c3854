#pragma once
// Transposing passes for the bf16 weight gradient. Inside a training step (Zen 4, AVX512_BF16) oneDNN's bf16 kernels
// multiply a transposed source (dW = dy^T x, K = tokens) at 0.8-0.95x the rate of the same product in plain rows
// (docs/precision.md); the linear layers' backward instead rounds x into its transpose (one pass, as the plain
// rounding it replaces), computes dW^T = x^T dy as a plain product and adds its transpose onto dW (in x out floats:
// small beside the product).
#include "core/tensor.h"
#include "ops/matmul_bf16.h"

namespace hlm::ops {

// dst[c * rows + r] = to_bf16(src[r * ld_src + c]) for r < rows, c < cols: the transpose of round_to_bf16's
// result, with the same bits. Parallel over row blocks when called outside a parallel region.
void round_to_bf16_transposed(const float* src, i64 rows, i64 cols, i64 ld_src, bf16* dst);

// dst[c * rows + r] += src[r * cols + c] for r < rows, c < cols (dst is [cols, rows], dense).
void add_transposed(const float* src, i64 rows, i64 cols, float* dst);

}  // namespace hlm::ops
