#include "ops/rope.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

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

namespace {

// sign = +1: forward rotation R(p); sign = -1: inverse R(p)^T (the backward).
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
  parallel_for(B * T, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) {
      const i64 p = pos ? pos[i] : i % T;
      const float* c = tab.cos.data() + p * half;  // [hd/2]
      const float* s = tab.sin.data() + p * half;  // [hd/2]
      float* row = x + i * row_stride;
      for (i64 h = 0; h < H; ++h) {
        float* x1 = row + h * hd;  // first half  [hd/2]
        float* x2 = x1 + half;     // second half [hd/2]
#pragma omp simd
        for (i64 m = 0; m < half; ++m) {
          const float a = x1[m], bb = x2[m], sn = sign * s[m];
          x1[m] = a * c[m] - bb * sn;
          x2[m] = bb * c[m] + a * sn;
        }
      }
    }
  }, 16);
}

}  // namespace

void rope_forward(const RopeTable& tab, float* x, i64 B, i64 T, i64 H, i64 row_stride, const int32_t* pos) {
  rope_apply("rope_forward", tab, x, B, T, H, row_stride, pos, 1.f);
}

void rope_backward(const RopeTable& tab, float* dx, i64 B, i64 T, i64 H, i64 row_stride, const int32_t* pos) {
  rope_apply("rope_backward", tab, dx, B, T, H, row_stride, pos, -1.f);
}

}  // namespace hlm::ops
