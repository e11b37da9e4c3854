#include "ops/l2norm.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace hlm::ops {

template <typename F>
void l2norm_forward(const F* x, i64 x_stride, F* y, i64 y_stride, F* rstd, i64 N, i64 H, i64 K, F eps, F scale) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && x_stride >= H * K && y_stride >= H * K && eps >= 0,
            "l2norm_forward: bad shape x[N={}, H={}, K={}] x_stride={} y_stride={} eps={}", N, H, K, x_stride, y_stride,
            double(eps));
  parallel_for(
      N * H,
      [&](i64 b, i64 e) {
        for (i64 r = b; r < e; ++r) {
          const i64 n = r / H, h = r % H;
          const F* xr = x + n * x_stride + h * K;
          F* yr = y + n * y_stride + h * K;
          // Sum of squares accumulated in double even for float rows: K is small and this keeps rstd exact.
          double ss = 0;
          for (i64 i = 0; i < K; ++i) ss += double(xr[i]) * double(xr[i]);
          const F rs = F(1.0 / std::sqrt(ss + double(eps)));
          rstd[r] = rs;
          const F m = rs * scale;
          for (i64 i = 0; i < K; ++i) yr[i] = xr[i] * m;
        }
      },
      64);
}

template <typename F>
void l2norm_backward(const F* y, i64 y_stride, const F* rstd, const F* dy, i64 dy_stride, F* dx, i64 dx_stride, i64 N,
                     i64 H, i64 K, F scale) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && y_stride >= H * K && dy_stride >= H * K && dx_stride >= H * K && scale != F(0),
            "l2norm_backward: bad shape y[N={}, H={}, K={}] y_stride={} dy_stride={} dx_stride={} scale={}", N, H, K,
            y_stride, dy_stride, dx_stride, double(scale));
  parallel_for(
      N * H,
      [&](i64 b, i64 e) {
        for (i64 r = b; r < e; ++r) {
          const i64 n = r / H, h = r % H;
          const F* yr = y + n * y_stride + h * K;
          const F* dyr = dy + n * dy_stride + h * K;
          F* dxr = dx + n * dx_stride + h * K;
          // yhat = y / scale is the unit-norm direction; dx = scale*rstd*(dy - yhat <yhat, dy>).
          F dot = 0;
          for (i64 i = 0; i < K; ++i) dot += yr[i] * dyr[i];
          const F c = dot / (scale * scale), m = scale * rstd[r];
          for (i64 i = 0; i < K; ++i) dxr[i] = m * (dyr[i] - yr[i] * c);
        }
      },
      64);
}

template void l2norm_forward<float>(const float*, i64, float*, i64, float*, i64, i64, i64, float, float);
template void l2norm_forward<double>(const double*, i64, double*, i64, double*, i64, i64, i64, double, double);
template void l2norm_backward<float>(const float*, i64, const float*, const float*, i64, float*, i64, i64, i64, i64,
                                     float);
template void l2norm_backward<double>(const double*, i64, const double*, const double*, i64, double*, i64, i64, i64,
                                      i64, double);

}  // namespace hlm::ops
