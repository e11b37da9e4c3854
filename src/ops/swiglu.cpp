// SwiGLU h = silu(gate) * up, written once with Google Highway and dispatched per SIMD target at run time
// (docs/performance.md), like the attention kernels.
#include "ops/swiglu.h"

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/swiglu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

void swiglu_forward_impl(const float* gu, float* h, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* g = gu + n * 2 * F;  // [F] gate
      const float* u = g + F;           // [F] up
      float* hr = h + n * F;            // [F]
      for_each_vector(d, F, [&](i64 f, size_t c) {
        const VF gv = load_part(d, g + f, c);
        store_part(d, hn::Mul(hn::Mul(gv, logistic(d, gv)), load_part(d, u + f, c)), hr + f, c);
      });
    }
  }, 16);
}

void swiglu_backward_impl(const float* gu, const float* dh, float* dgu, float* h, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    const VF one = hn::Set(d, 1.f);
    for (i64 n = b; n < e; ++n) {
      const float* g = gu + n * 2 * F;
      const float* u = g + F;
      const float* dr = dh + n * F;
      float* dg = dgu + n * 2 * F;  // [F] d gate
      float* du = dg + F;           // [F] d up
      float* hr = h ? h + n * F : nullptr;
      for_each_vector(d, F, [&](i64 f, size_t c) {
        const VF gv = load_part(d, g + f, c), uv = load_part(d, u + f, c), dv = load_part(d, dr + f, c);
        const VF s = logistic(d, gv);
        // d silu / dg = s * (1 + g * (1 - s))
        const VF dsilu = hn::Mul(s, hn::MulAdd(gv, hn::Sub(one, s), one));
        store_part(d, hn::Mul(hn::Mul(dv, uv), dsilu), dg + f, c);
        const VF silu = hn::Mul(gv, s);
        store_part(d, hn::Mul(dv, silu), du + f, c);
        if (hr) store_part(d, hn::Mul(silu, uv), hr + f, c);  // after dv was loaded: h may alias dh
      });
    }
  }, 16);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(swiglu_forward_impl);
HWY_EXPORT(swiglu_backward_impl);

void swiglu_forward(const float* gu, float* h, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0, "swiglu_forward: bad shape gu[{}, {}] h[{}, {}]", N, 2 * F, N, F);
  init_simd();
  HWY_DYNAMIC_DISPATCH(swiglu_forward_impl)(gu, h, N, F);
}

void swiglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h) {
  HLM_CHECK(N >= 0 && F > 0, "swiglu_backward: bad shape gu[{}, {}] dh[{}, {}]", N, 2 * F, N, F);
  init_simd();
  HWY_DYNAMIC_DISPATCH(swiglu_backward_impl)(gu, dh, dgu, h, N, F);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
