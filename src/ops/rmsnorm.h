#pragma once
#include "core/tensor.h"

namespace hlm::ops {

// y[N,D] = x * rsqrt(mean(x^2) + eps) * w; saves rstd[N] for backward. w may be nullptr (weightless). y may be x
// (in place: each row is read whole before it is written).
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, i64 N, i64 D, float eps);
// A block's residual add and the norm after it in one pass: h += r, then rmsnorm_forward(h, w, y, rstd) (the same
// bits as the two steps; y must not overlap h or r).
void residual_rmsnorm_forward(float* h, const float* r, const float* w, float* y, float* rstd, i64 N, i64 D,
                              float eps);
// dx[N,D] overwritten, or with accumulate_dx added onto (a residual stream's gradient: the same bits as writing a
// buffer and adding it); dw[D] += (accumulates; skipped if w or dw is nullptr). Without accumulate_dx, dx may be x
// itself (in place: each row is read whole before it is written).
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                      float* dw, i64 N, i64 D, bool accumulate_dx = false);

}  // namespace hlm::ops
