#pragma once
// Cross-entropy fused with the LM head: logits = h W^T are produced one (row block x vocab chunk) tile
// at a time with an online log-sum-exp, so the [N, V] logits never exist in memory at once.
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

}  // namespace hlm::ops
