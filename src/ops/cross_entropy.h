#pragma once
// Cross-entropy fused with the LM head: logits = h W^T are produced one (row block x vocab chunk) tile
// at a time with an online log-sum-exp, so the [N, V] logits never exist in memory at once.
// Backward recomputes each tile's logits, forms (softmax - onehot) * grad_scale in place and does
// dh += dlogits W_chunk, dW_chunk += dlogits^T h_rows. Threads split the (rows x vocab) plane into a fixed
// grid; partial sums are combined in a fixed order, so results are deterministic for a thread count.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// h[N,D], W[V,D], targets[N] (a target < 0 is ignored). Writes lse[N] (saved for backward) and, if
// token_loss != nullptr, token_loss[N] (0 for ignored rows). Returns the SUM of losses over counted rows.
double lm_head_ce_forward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V,
                          float* lse, float* token_loss = nullptr);
// d(loss * grad_scale): dh[N,D] overwritten, dW[V,D] += (accumulates). grad_scale is typically
// 1 / (number of counted targets in the global batch).
void lm_head_ce_backward(const float* h, const float* W, const int32_t* targets, const float* lse,
                         i64 N, i64 D, i64 V, float grad_scale, float* dh, float* dW);

// Tiling knobs, for tests (odd tile edges, every thread grid) and tuning; the functions above use the
// defaults. grid_p x grid_q = row groups x vocab groups (0 = chosen from the thread count and sizes).
struct CeTiling {
  i64 rows = 256, cols = 512;  // a 256 x 512 logits tile (0.5 MiB) stays in L2 next to the sgemm panels
  i64 grid_p = 0, grid_q = 0;
  i64 fused_rows = 0;  // lm_head_ce_forward_backward's row block (0: whole-row blocks of about 4 MiB, <= 256 rows)
};
double lm_head_ce_forward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V,
                          float* lse, float* token_loss, const CeTiling& tiling);
void lm_head_ce_backward(const float* h, const float* W, const int32_t* targets, const float* lse,
                         i64 N, i64 D, i64 V, float grad_scale, float* dh, float* dW, const CeTiling& tiling);

// Training's forward and backward in one pass: what lm_head_ce_forward returns and writes, plus the gradients of
// lm_head_ce_backward (dh overwritten, dW +=). Each block of whole rows has its logits made once and turned into
// dlogits in place once the rows' log-sum-exp is known: three products of N x D x V instead of the four of the
// two calls (backward recomputes the logits). Threads split rows only (a dW partial per extra row group); when
// those partials would pass the scratch bound, or the tiling asks for vocab groups, it makes the two calls.
// With `workspace` (64-byte aligned, at least lm_head_ce_workspace_floats(N, D, V, tiling) floats, e.g. a region of
// the training arena that is free while the head runs) its buffers (the dW partials and each row group's logits
// block) go there; otherwise (null, or too small) into buffers each thread keeps, which stay resident after the call.
// The same bits either way.
double lm_head_ce_forward_backward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V,
                                   float grad_scale, float* lse, float* token_loss, float* dh, float* dW,
                                   const CeTiling& tiling = {}, float* workspace = nullptr, i64 workspace_floats = 0);
// The floats lm_head_ce_forward_backward's buffers take at this shape and the current thread count (0 where it makes
// the two calls instead, whose tiles are small).
i64 lm_head_ce_workspace_floats(i64 N, i64 D, i64 V, const CeTiling& tiling = {});

}  // namespace hlm::ops
