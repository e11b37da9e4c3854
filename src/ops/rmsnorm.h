#pragma once
#include "core/tensor.h"

namespace hlm::ops {

// y[N,D] = x * rsqrt(mean(x^2) + eps) * w; saves rstd[N] for backward. w may be nullptr (weightless).
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, i64 N, i64 D, float eps);
// dx[N,D] overwritten; dw[D] += (accumulates; skipped if w or dw is nullptr). dx may be x itself (in place: each
// row is read whole before it is written).
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                      float* dw, i64 N, i64 D);

}  // namespace hlm::ops
