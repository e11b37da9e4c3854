#include "ops/swiglu.h"

#include "core/error.h"
#include "core/parallel.h"
#include "ops/fast_exp.h"

namespace hlm::ops {

void swiglu_forward(const float* gu, float* h, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0, "swiglu_forward: bad shape gu[{}, {}] h[{}, {}]", N, 2 * F, N, F);
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* g = gu + n * 2 * F;  // [F] gate
      const float* u = g + F;           // [F] up
      float* hr = h + n * F;            // [F]
#pragma omp simd
      for (i64 f = 0; f < F; ++f) {
        // sigmoid(g) = 1 / (1 + exp(-g)); fast_exp returns 0 / saturates at the extremes, so this stays finite.
        const float s = 1.f / (1.f + fast_exp(-g[f]));
        hr[f] = g[f] * s * u[f];
      }
    }
  }, 16);
}

void swiglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0, "swiglu_backward: bad shape gu[{}, {}] dh[{}, {}]", N, 2 * F, N, F);
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* g = gu + n * 2 * F;
      const float* u = g + F;
      const float* d = dh + n * F;
      float* dg = dgu + n * 2 * F;  // [F] d gate
      float* du = dg + F;           // [F] d up
#pragma omp simd
      for (i64 f = 0; f < F; ++f) {
        const float s = 1.f / (1.f + fast_exp(-g[f]));
        const float silu = g[f] * s;
        // d silu / dg = s * (1 + g * (1 - s))
        dg[f] = d[f] * u[f] * s * (1.f + g[f] * (1.f - s));
        du[f] = d[f] * silu;
      }
    }
  }, 16);
}

}  // namespace hlm::ops
