// RMSNorm y = x / rms(x) * w, written once with Google Highway and dispatched per SIMD target at run time
// (docs/performance.md).
#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rmsnorm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// With res (residual_rmsnorm_forward): sum = x + res is stored first (sum may be x), row by row, and normalized; the
// second pass reads the row back from L1.
void rmsnorm_forward_impl(const float* x, const float* res, float* sum, const float* w, float* y, float* rstd, i64 N,
                          i64 D, float eps) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* xr = x + n * D;  // [D]
      float* yr = y + n * D;        // [D]
      float* sr = res ? sum + n * D : nullptr;
      VF ss = hn::Zero(d);
      for_each_vector(d, D, [&](i64 i, size_t c) {
        VF v = load_part(d, xr + i, c);
        if (sr) {
          v = hn::Add(v, load_part(d, res + n * D + i, c));
          store_part(d, v, sr + i, c);
        }
        ss = hn::MulAdd(v, v, ss);
      });
      if (sr) xr = sr;
      const float r = 1.f / std::sqrt(sum_lanes(d, ss) / static_cast<float>(D) + eps);
      rstd[n] = r;
      const VF rv = hn::Set(d, r);
      for_each_vector(d, D, [&](i64 i, size_t c) {
        const VF v = hn::Mul(load_part(d, xr + i, c), rv);
        store_part(d, w ? hn::Mul(v, load_part(d, w + i, c)) : v, yr + i, c);
      });
    }
  }, 16);
}

// With g = dy * w and y_hat = x * r:  dx = r * (g - y_hat * mean(g * y_hat));  dw += sum_n dy * y_hat.
// dw is reduced over fixed row chunks (one partial per chunk, summed in chunk order): deterministic for a
// given thread count and no atomics.
void rmsnorm_backward_impl(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                           i64 N, i64 D, bool accumulate_dx) {
  const bool want_dw = w != nullptr && dw != nullptr;
  const i64 nchunks = std::max<i64>(1, std::min<i64>(num_threads(), N));
  std::vector<float> part(want_dw ? nchunks * D : 0, 0.f);  // [nchunks, D]
  parallel_for_each(nchunks, [&](i64 ch) {
    const DF d;
    const i64 b = N * ch / nchunks, e = N * (ch + 1) / nchunks;
    float* pw = want_dw ? part.data() + ch * D : nullptr;
    for (i64 n = b; n < e; ++n) {
      const float* xr = x + n * D;
      const float* dyr = dy + n * D;
      float* dxr = dx + n * D;
      const float r = rstd[n];
      VF acc = hn::Zero(d);  // sum_d g_d * x_d
      for_each_vector(d, D, [&](i64 i, size_t c) {
        VF g = load_part(d, dyr + i, c);
        if (w) g = hn::Mul(g, load_part(d, w + i, c));
        acc = hn::MulAdd(g, load_part(d, xr + i, c), acc);
      });
      const VF rv = hn::Set(d, r);
      const VF c2 = hn::Set(d, sum_lanes(d, acc) * r * r * r / static_cast<float>(D));
      for_each_vector(d, D, [&](i64 i, size_t c) {
        const VF dyv = load_part(d, dyr + i, c), xv = load_part(d, xr + i, c);
        const VF g = w ? hn::Mul(dyv, load_part(d, w + i, c)) : dyv;
        const VF gx = hn::NegMulAdd(c2, xv, hn::Mul(rv, g));
        store_part(d, accumulate_dx ? hn::Add(load_part(d, dxr + i, c), gx) : gx, dxr + i, c);
        if (pw) store_part(d, hn::MulAdd(hn::Mul(dyv, xv), rv, load_part(d, pw + i, c)), pw + i, c);
      });
    }
  });
  if (want_dw) add_rows_in_order(DF(), part.data(), nchunks, D, dw);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(rmsnorm_forward_impl);
HWY_EXPORT(rmsnorm_backward_impl);

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, i64 N, i64 D, float eps) {
  HLM_CHECK(N >= 0 && D > 0 && eps >= 0.f, "rmsnorm_forward: bad shape x[{}, {}] eps={}", N, D, eps);
  init_simd();
  HWY_DYNAMIC_DISPATCH(rmsnorm_forward_impl)(x, nullptr, nullptr, w, y, rstd, N, D, eps);
}

void residual_rmsnorm_forward(float* h, const float* r, const float* w, float* y, float* rstd, i64 N, i64 D,
                              float eps) {
  HLM_CHECK(N >= 0 && D > 0 && eps >= 0.f, "residual_rmsnorm_forward: bad shape h[{}, {}] eps={}", N, D, eps);
  HLM_CHECK(r != nullptr, "residual_rmsnorm_forward: no residual to add (r is null; use rmsnorm_forward)");
  init_simd();
  HWY_DYNAMIC_DISPATCH(rmsnorm_forward_impl)(h, r, h, w, y, rstd, N, D, eps);
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      i64 N, i64 D, bool accumulate_dx) {
  HLM_CHECK(N >= 0 && D > 0, "rmsnorm_backward: bad shape x[{}, {}]", N, D);
  HLM_CHECK(!accumulate_dx || dx != x || N == 0, "rmsnorm_backward: dx cannot accumulate onto x itself");
  init_simd();
  HWY_DYNAMIC_DISPATCH(rmsnorm_backward_impl)(x, w, rstd, dy, dx, dw, N, D, accumulate_dx);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
