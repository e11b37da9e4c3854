#pragma once
// Per-head L2 normalisation (Gated DeltaNet q and k): y = scale * x / sqrt(sum(x^2) + eps) over each row of
// length K. Layout [N, H, K]: row (n, h) of x starts at x + n*x_stride + h*K (x_stride >= H*K), likewise y.
// Instantiated for float (the engine) and double (the test oracles).
#include "core/tensor.h"

namespace hlm::ops {

// rstd[N, H] = 1/sqrt(sum x^2 + eps) is saved for backward. y may alias x (same stride).
template <typename F>
void l2norm_forward(const F* x, i64 x_stride, F* y, i64 y_stride, F* rstd, i64 N, i64 H, i64 K, F eps = F(1e-6),
                    F scale = F(1));

// dx = scale * rstd * (dy - yhat <yhat, dy>) with yhat = y / scale (y is the forward output).
// dx overwritten; dx may alias dy (same stride).
template <typename F>
void l2norm_backward(const F* y, i64 y_stride, const F* rstd, const F* dy, i64 dy_stride, F* dx, i64 dx_stride, i64 N,
                     i64 H, i64 K, F scale = F(1));

extern template void l2norm_forward<float>(const float*, i64, float*, i64, float*, i64, i64, i64, float, float);
extern template void l2norm_forward<double>(const double*, i64, double*, i64, double*, i64, i64, i64, double, double);
extern template void l2norm_backward<float>(const float*, i64, const float*, const float*, i64, float*, i64, i64, i64,
                                            i64, float);
extern template void l2norm_backward<double>(const double*, i64, const double*, const double*, i64, double*, i64, i64,
                                             i64, i64, double);

}  // namespace hlm::ops
