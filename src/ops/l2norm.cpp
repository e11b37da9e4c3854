// Per-head L2 norm: the float rows (the engine) on Google Highway, one copy per SIMD target (docs/performance.md);
// the double rows (test oracles) as plain loops.
#include "ops/l2norm.h"

#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/l2norm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

void l2norm_forward_f32(const float* x, i64 x_stride, float* y, i64 y_stride, float* rstd, i64 N, i64 H, i64 K,
                        float eps, float scale) {
  parallel_for(N * H, [&](i64 b, i64 e) {
    const DF d;
    for (i64 r = b; r < e; ++r) {
      const i64 n = r / H, h = r % H;
      const float* xr = x + n * x_stride + h * K;
      float* yr = y + n * y_stride + h * K;
      // Lane-wise partial sums of squares (all terms >= 0: relative error ~ (K / lanes + log2 lanes) u).
      VF ss = hn::Zero(d);
      for_each_vector(d, K, [&](i64 i, size_t c) {
        const VF v = load_part(d, xr + i, c);
        ss = hn::MulAdd(v, v, ss);
      });
      const float rs = static_cast<float>(1.0 / std::sqrt(double(sum_lanes(d, ss)) + double(eps)));
      rstd[r] = rs;
      const VF m = hn::Set(d, rs * scale);
      for_each_vector(d, K, [&](i64 i, size_t c) { store_part(d, hn::Mul(load_part(d, xr + i, c), m), yr + i, c); });
    }
  }, 64);
}

void l2norm_backward_f32(const float* y, i64 y_stride, const float* rstd, const float* dy, i64 dy_stride, float* dx,
                         i64 dx_stride, i64 N, i64 H, i64 K, float scale) {
  parallel_for(N * H, [&](i64 b, i64 e) {
    const DF d;
    for (i64 r = b; r < e; ++r) {
      const i64 n = r / H, h = r % H;
      const float* yr = y + n * y_stride + h * K;
      const float* dyr = dy + n * dy_stride + h * K;
      float* dxr = dx + n * dx_stride + h * K;
      VF dot = hn::Zero(d);
      for_each_vector(d, K, [&](i64 i, size_t c) {
        dot = hn::MulAdd(load_part(d, yr + i, c), load_part(d, dyr + i, c), dot);
      });
      const VF cv = hn::Set(d, sum_lanes(d, dot) / (scale * scale)), m = hn::Set(d, scale * rstd[r]);
      // dx = m (dy - y c); dy is read before dx is written (they may alias).
      for_each_vector(d, K, [&](i64 i, size_t c) {
        const VF v = hn::NegMulAdd(load_part(d, yr + i, c), cv, load_part(d, dyr + i, c));
        store_part(d, hn::Mul(m, v), dxr + i, c);
      });
    }
  }, 64);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(l2norm_forward_f32);
HWY_EXPORT(l2norm_backward_f32);

namespace {
// fn(n, h, r) for every row r = n*H + h, in parallel.
template <class Fn>
void for_each_head_row(i64 N, i64 H, const Fn& fn) {
  parallel_for(N * H, [&](i64 b, i64 e) {
    for (i64 r = b; r < e; ++r) fn(r / H, r % H, r);
  }, 64);
}
}  // namespace

template <typename F>
void l2norm_forward(const F* x, i64 x_stride, F* y, i64 y_stride, F* rstd, i64 N, i64 H, i64 K, F eps, F scale) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && x_stride >= H * K && y_stride >= H * K && eps >= 0,
            "l2norm_forward: bad shape x[N={}, H={}, K={}] x_stride={} y_stride={} eps={}", N, H, K, x_stride, y_stride,
            double(eps));
  if constexpr (std::is_same_v<F, float>) {
    init_simd();
    HWY_DYNAMIC_DISPATCH(l2norm_forward_f32)(x, x_stride, y, y_stride, rstd, N, H, K, eps, scale);
  } else {
    for_each_head_row(N, H, [&](i64 n, i64 h, i64 r) {
      const F* xr = x + n * x_stride + h * K;
      F* yr = y + n * y_stride + h * K;
      F ss = 0;
      for (i64 i = 0; i < K; ++i) ss += xr[i] * xr[i];
      const F rs = F(1) / std::sqrt(ss + eps);
      rstd[r] = rs;
      const F m = rs * scale;
      for (i64 i = 0; i < K; ++i) yr[i] = xr[i] * m;
    });
  }
}

template <typename F>
void l2norm_backward(const F* y, i64 y_stride, const F* rstd, const F* dy, i64 dy_stride, F* dx, i64 dx_stride, i64 N,
                     i64 H, i64 K, F scale) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && y_stride >= H * K && dy_stride >= H * K && dx_stride >= H * K && scale != F(0),
            "l2norm_backward: bad shape y[N={}, H={}, K={}] y_stride={} dy_stride={} dx_stride={} scale={}", N, H, K,
            y_stride, dy_stride, dx_stride, double(scale));
  if constexpr (std::is_same_v<F, float>) {
    init_simd();
    HWY_DYNAMIC_DISPATCH(l2norm_backward_f32)(y, y_stride, rstd, dy, dy_stride, dx, dx_stride, N, H, K, scale);
  } else {
    for_each_head_row(N, H, [&](i64 n, i64 h, i64 r) {
      const F* yr = y + n * y_stride + h * K;
      const F* dyr = dy + n * dy_stride + h * K;
      F* dxr = dx + n * dx_stride + h * K;
      // yhat = y / scale is the unit-norm direction; dx = scale*rstd*(dy - yhat <yhat, dy>).
      F dot = 0;
      for (i64 i = 0; i < K; ++i) dot += yr[i] * dyr[i];
      const F c = dot / (scale * scale), m = scale * rstd[r];
      for (i64 i = 0; i < K; ++i) dxr[i] = m * (dyr[i] - yr[i] * c);
    });
  }
}

template void l2norm_forward<float>(const float*, i64, float*, i64, float*, i64, i64, i64, float, float);
template void l2norm_forward<double>(const double*, i64, double*, i64, double*, i64, i64, i64, double, double);
template void l2norm_backward<float>(const float*, i64, const float*, const float*, i64, float*, i64, i64, i64, i64,
                                     float);
template void l2norm_backward<double>(const double*, i64, const double*, const double*, i64, double*, i64, i64, i64,
                                      i64, double);

}  // namespace hlm::ops
#endif  // HWY_ONCE
