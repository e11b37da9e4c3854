#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace hlm::ops {

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, i64 N, i64 D, float eps) {
  HLM_CHECK(N >= 0 && D > 0 && eps >= 0.f, "rmsnorm_forward: bad shape x[{}, {}] eps={}", N, D, eps);
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* xr = x + n * D;  // [D]
      float* yr = y + n * D;        // [D]
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (i64 d = 0; d < D; ++d) ss += xr[d] * xr[d];
      const float r = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
      rstd[n] = r;
      if (w) {
#pragma omp simd
        for (i64 d = 0; d < D; ++d) yr[d] = xr[d] * r * w[d];
      } else {
#pragma omp simd
        for (i64 d = 0; d < D; ++d) yr[d] = xr[d] * r;
      }
    }
  }, 16);
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      i64 N, i64 D) {
  HLM_CHECK(N >= 0 && D > 0, "rmsnorm_backward: bad shape x[{}, {}]", N, D);
  // With g = dy * w and y_hat = x * r:  dx = r * (g - y_hat * mean(g * y_hat));  dw += sum_n dy * y_hat.
  // dw is reduced over fixed row chunks (one partial per chunk, summed in chunk order): deterministic for a
  // given thread count and no atomics.
  const bool want_dw = w != nullptr && dw != nullptr;
  const i64 nchunks = std::max<i64>(1, std::min<i64>(num_threads(), N));
  std::vector<float> part(want_dw ? nchunks * D : 0, 0.f);  // [nchunks, D]
  parallel_for_each(nchunks, [&](i64 c) {
    const i64 b = N * c / nchunks, e = N * (c + 1) / nchunks;
    float* pw = want_dw ? part.data() + c * D : nullptr;
    for (i64 n = b; n < e; ++n) {
      const float* xr = x + n * D;
      const float* dyr = dy + n * D;
      float* dxr = dx + n * D;
      const float r = rstd[n];
      float dot = 0.f;  // sum_d g_d * x_d
      if (w) {
#pragma omp simd reduction(+ : dot)
        for (i64 d = 0; d < D; ++d) dot += dyr[d] * w[d] * xr[d];
      } else {
#pragma omp simd reduction(+ : dot)
        for (i64 d = 0; d < D; ++d) dot += dyr[d] * xr[d];
      }
      const float c2 = dot * r * r * r / static_cast<float>(D);
      if (w) {
#pragma omp simd
        for (i64 d = 0; d < D; ++d) dxr[d] = r * dyr[d] * w[d] - c2 * xr[d];
      } else {
#pragma omp simd
        for (i64 d = 0; d < D; ++d) dxr[d] = r * dyr[d] - c2 * xr[d];
      }
      if (pw) {
#pragma omp simd
        for (i64 d = 0; d < D; ++d) pw[d] += dyr[d] * xr[d] * r;
      }
    }
  });
  if (want_dw)
    for (i64 c = 0; c < nchunks; ++c)
#pragma omp simd
      for (i64 d = 0; d < D; ++d) dw[d] += part[c * D + d];
}

}  // namespace hlm::ops
