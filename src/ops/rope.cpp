// Rotary position embedding (half-split pairs, angles from a table). The rotation is written once with Google
// Highway and dispatched per SIMD target at run time (docs/performance.md); the table is built in double.
#include "ops/rope.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin for each head's halves (x1, x2); sign = -1 applies the inverse
// rotation R(p)^T (the backward). Positions are checked by the caller.
void rope_rotate_impl(const float* cos_tab, const float* sin_tab, i64 half, float* x, i64 B, i64 T, i64 H,
                      i64 row_stride, const int32_t* pos, float sign) {
  const i64 hd = 2 * half;
  parallel_for(B * T, [&](i64 b, i64 e) {
    const DF d;
    const VF sg = hn::Set(d, sign);
    for (i64 i = b; i < e; ++i) {
      const i64 p = pos ? pos[i] : i % T;
      const float* c = cos_tab + p * half;  // [hd/2]
      const float* s = sin_tab + p * half;  // [hd/2]
      float* row = x + i * row_stride;
      for (i64 h = 0; h < H; ++h) {
        float* x1 = row + h * hd;  // first half  [hd/2]
        float* x2 = x1 + half;     // second half [hd/2]
        for_each_vector(d, half, [&](i64 m, size_t n) {
          const VF a = load_part(d, x1 + m, n), bb = load_part(d, x2 + m, n), cv = load_part(d, c + m, n);
          const VF sn = hn::Mul(sg, load_part(d, s + m, n));
          store_part(d, hn::NegMulAdd(bb, sn, hn::Mul(a, cv)), x1 + m, n);
          store_part(d, hn::MulAdd(a, sn, hn::Mul(bb, cv)), x2 + m, n);
        });
      }
    }
  }, 16);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

RopeTable::RopeTable(i64 max_pos_, i64 head_dim_, double theta) { fill(0, max_pos_, head_dim_, theta); }

void RopeTable::fill(i64 first_pos, i64 n, i64 head_dim_, double theta) {
  HLM_CHECK(n > 0 && first_pos >= 0 && head_dim_ > 0 && head_dim_ % 2 == 0 && theta > 0,
            "RopeTable: bad arguments rows={} first_pos={} head_dim={} (must be even) theta={}", n, first_pos,
            head_dim_, theta);
  max_pos = n;
  head_dim = head_dim_;
  const i64 half = head_dim / 2;
  cos.resize(n * half);
  sin.resize(n * half);
  for (i64 m = 0; m < half; ++m) {
    // Angles in double: p * inv_freq loses digits in fp32 at large p (p ~ 1e5 gives ~1e-2 rad error).
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(m) / static_cast<double>(head_dim));
    for (i64 p = 0; p < n; ++p) {
      const double a = static_cast<double>(first_pos + p) * inv_freq;
      cos[p * half + m] = static_cast<float>(std::cos(a));
      sin[p * half + m] = static_cast<float>(std::sin(a));
    }
  }
}

HWY_EXPORT(rope_rotate_impl);

namespace {

void rope_apply(const char* op, const RopeTable& tab, float* x, i64 B, i64 T, i64 H, i64 row_stride,
                const int32_t* pos, float sign) {
  const i64 hd = tab.head_dim, half = hd / 2;
  HLM_CHECK(B >= 0 && T >= 0 && H > 0 && hd > 0 && row_stride >= H * hd,
            "{}: bad shape x[{}, {}, {}, {}] row_stride={} (table head_dim {})", op, B, T, H, hd, row_stride, hd);
  if (pos) {
    for (i64 i = 0; i < B * T; ++i)
      HLM_CHECK(pos[i] >= 0 && pos[i] < tab.max_pos, "{}: position {} at token {} outside [0, {}) (x[{}, {}, {}, {}])",
                op, pos[i], i, tab.max_pos, B, T, H, hd);
  } else {
    HLM_CHECK(T <= tab.max_pos, "{}: T={} exceeds table max_pos={} (x[{}, {}, {}, {}])", op, T, tab.max_pos, B, T,
              H, hd);
  }
  init_simd();
  HWY_DYNAMIC_DISPATCH(rope_rotate_impl)(tab.cos.data(), tab.sin.data(), half, x, B, T, H, row_stride, pos, sign);
}

}  // namespace

void rope_forward(const RopeTable& tab, float* x, i64 B, i64 T, i64 H, i64 row_stride, const int32_t* pos) {
  rope_apply("rope_forward", tab, x, B, T, H, row_stride, pos, 1.f);
}

void rope_backward(const RopeTable& tab, float* dx, i64 B, i64 T, i64 H, i64 row_stride, const int32_t* pos) {
  rope_apply("rope_backward", tab, dx, B, T, H, row_stride, pos, -1.f);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
