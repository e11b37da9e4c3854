// The gated unit h = act(gate) * up (SwiGLU, GeGLU), written once with Google Highway for every activation and
// dispatched per SIMD target at run time (docs/performance.md), like the attention kernels.
#include "ops/gated_unit.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"
#include "ops/thread_scratch.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/gated_unit.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A kernel's output lane store: fp32 as computed, or rounded to bf16 for a bf16 step's matmul (the same bits as
// rounding the fp32 output afterwards).
HWY_INLINE void store_out(DF d, VF v, float* p, size_t c) { store_part(d, v, p, c); }
HWY_INLINE void store_out(DF d, VF v, uint16_t* p, size_t c) { store_bf16_part(d, v, p, c); }

// gate|up lane loads: fp32 as stored, or bf16 widened (a bf16 step stores the gate|up product rounded).
HWY_INLINE VF load_in(DF d, const float* p, size_t c) { return load_part(d, p, c); }
HWY_INLINE VF load_in(DF d, const uint16_t* p, size_t c) { return load_bf16_part(d, p, c); }

// An activation: value(d, g), and value_and_slope(d, g, a, da) giving act(g) and act'(g).
// silu(g) = g * sigmoid(g); its slope s * (1 + g * (1 - s)) with s = sigmoid(g).
struct Silu {
  static HWY_INLINE VF value(DF d, VF g) { return hn::Mul(g, logistic(d, g)); }
  static HWY_INLINE void value_and_slope(DF d, VF g, VF& a, VF& da) {
    const VF one = hn::Set(d, 1.f), s = logistic(d, g);
    da = hn::Mul(s, hn::MulAdd(g, hn::Sub(one, s), one));
    a = hn::Mul(g, s);
  }
};

// gelu_tanh(g) = g * s with s = sigmoid(z), z = g (c1 + c3 g^2), c1 = 2 sqrt(2/pi), c3 = 0.044715 c1; its slope
// s + g s (1 - s) (c1 + 3 c3 g^2). Through the saturating logistic(): finite for every finite g.
struct GeluTanh {
  static constexpr float kC1 = 1.5957691216057308f, kC3 = 0.0713548162726008f;
  static HWY_INLINE VF z(DF d, VF g, VF g2) { return hn::Mul(g, hn::MulAdd(hn::Set(d, kC3), g2, hn::Set(d, kC1))); }
  static HWY_INLINE VF value(DF d, VF g) { return hn::Mul(g, logistic(d, z(d, g, hn::Mul(g, g)))); }
  static HWY_INLINE void value_and_slope(DF d, VF g, VF& a, VF& da) {
    const VF g2 = hn::Mul(g, g), s = logistic(d, z(d, g, g2));
    const VF dz = hn::MulAdd(hn::Set(d, 3.f * kC3), g2, hn::Set(d, kC1));  // dz / dg
    a = hn::Mul(g, s);
    da = hn::MulAdd(hn::Mul(a, hn::Sub(hn::Set(d, 1.f), s)), dz, s);
  }
};

template <class Act, typename In, typename Out>
void forward(const In* gu, Out* h, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const In* g = gu + n * 2 * F;  // [F] gate
      const In* u = g + F;           // [F] up
      Out* hr = h + n * F;           // [F]
      for_each_vector(d, F, [&](i64 f, size_t c) {
        store_out(d, hn::Mul(Act::value(d, load_in(d, g + f, c)), load_in(d, u + f, c)), hr + f, c);
      });
    }
  }, 16);
}

// Out = bf16: a row of dgu takes exactly the bytes of a row of dh, so dgu may sit in dh's memory; dh's row is
// copied first (its second half is overwritten by d up before the loop reaches it). In = Out: dgu may also sit in
// gu's memory (each lane is read before it is written).
template <class Act, typename In, typename Out>
void backward(const In* gu, const float* dh, Out* dgu, Out* h, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    float* dh_copy = std::is_same_v<Out, float> ? nullptr : thread_scratch<float>(0, F);
    for (i64 n = b; n < e; ++n) {
      const In* g = gu + n * 2 * F;
      const In* u = g + F;
      const float* dr = dh + n * F;
      if (dh_copy) {
        std::copy(dr, dr + F, dh_copy);
        dr = dh_copy;
      }
      Out* dg = dgu + n * 2 * F;  // [F] d gate
      Out* du = dg + F;           // [F] d up
      Out* hr = h ? h + n * F : nullptr;
      for_each_vector(d, F, [&](i64 f, size_t c) {
        const VF gv = load_in(d, g + f, c), uv = load_in(d, u + f, c), dv = load_part(d, dr + f, c);
        VF a, da;  // act(gate), act'(gate)
        Act::value_and_slope(d, gv, a, da);
        store_out(d, hn::Mul(hn::Mul(dv, uv), da), dg + f, c);
        store_out(d, hn::Mul(dv, a), du + f, c);
        if (hr) store_out(d, hn::Mul(a, uv), hr + f, c);  // after dv was loaded: h may alias dh
      });
    }
  }, 16);
}

// The exported kernels: `gelu` picks GeGLU's activation, else SwiGLU's.
void gated_forward_impl(bool gelu, const float* gu, float* h, i64 N, i64 F) {
  gelu ? forward<GeluTanh>(gu, h, N, F) : forward<Silu>(gu, h, N, F);
}
void gated_forward_bf16_impl(bool gelu, const uint16_t* gu, uint16_t* h, i64 N, i64 F) {
  gelu ? forward<GeluTanh>(gu, h, N, F) : forward<Silu>(gu, h, N, F);
}
void gated_backward_impl(bool gelu, const float* gu, const float* dh, float* dgu, float* h, i64 N, i64 F) {
  gelu ? backward<GeluTanh>(gu, dh, dgu, h, N, F) : backward<Silu>(gu, dh, dgu, h, N, F);
}
void gated_backward_bf16_impl(bool gelu, const uint16_t* gu, const float* dh, uint16_t* dgu, uint16_t* h, i64 N,
                              i64 F) {
  gelu ? backward<GeluTanh>(gu, dh, dgu, h, N, F) : backward<Silu>(gu, dh, dgu, h, N, F);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(gated_forward_impl);
HWY_EXPORT(gated_backward_impl);
HWY_EXPORT(gated_forward_bf16_impl);
HWY_EXPORT(gated_backward_bf16_impl);

namespace {
// The shape check every entry makes (`h` names the [N, F] operand), then the SIMD target's set-up.
void check_shape(const char* op, const char* h, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0, "{}: bad shape gu[{}, {}] {}[{}, {}]", op, N, 2 * F, h, N, F);
  init_simd();
}
constexpr bool kSilu = false, kGelu = true;
}  // namespace

void swiglu_forward(const float* gu, float* h, i64 N, i64 F) {
  check_shape("swiglu_forward", "h", N, F);
  HWY_DYNAMIC_DISPATCH(gated_forward_impl)(kSilu, gu, h, N, F);
}
void swiglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h) {
  check_shape("swiglu_backward", "dh", N, F);
  HWY_DYNAMIC_DISPATCH(gated_backward_impl)(kSilu, gu, dh, dgu, h, N, F);
}
void swiglu_forward_bf16(const bf16* gu, bf16* h, i64 N, i64 F) {
  check_shape("swiglu_forward_bf16", "h", N, F);
  HWY_DYNAMIC_DISPATCH(gated_forward_bf16_impl)(kSilu, gu, h, N, F);
}
void swiglu_backward_bf16(const bf16* gu, const float* dh, bf16* dgu, i64 N, i64 F, bf16* h) {
  check_shape("swiglu_backward_bf16", "dh", N, F);
  HWY_DYNAMIC_DISPATCH(gated_backward_bf16_impl)(kSilu, gu, dh, dgu, h, N, F);
}
void geglu_forward(const float* gu, float* h, i64 N, i64 F) {
  check_shape("geglu_forward", "h", N, F);
  HWY_DYNAMIC_DISPATCH(gated_forward_impl)(kGelu, gu, h, N, F);
}
void geglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h) {
  check_shape("geglu_backward", "dh", N, F);
  HWY_DYNAMIC_DISPATCH(gated_backward_impl)(kGelu, gu, dh, dgu, h, N, F);
}
void geglu_forward_bf16(const bf16* gu, bf16* h, i64 N, i64 F) {
  check_shape("geglu_forward_bf16", "h", N, F);
  HWY_DYNAMIC_DISPATCH(gated_forward_bf16_impl)(kGelu, gu, h, N, F);
}
void geglu_backward_bf16(const bf16* gu, const float* dh, bf16* dgu, i64 N, i64 F, bf16* h) {
  check_shape("geglu_backward_bf16", "dh", N, F);
  HWY_DYNAMIC_DISPATCH(gated_backward_bf16_impl)(kGelu, gu, dh, dgu, h, N, F);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
