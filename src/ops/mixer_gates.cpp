// The linear mixers' elementwise gates on Google Highway, one copy per SIMD target (ops/mixer_gates.h).
#include "ops/mixer_gates.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/mixer_gates.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// softplus(z) = log(1 + e^z), and z itself above 20 (torch's threshold, where the two agree in float).
HWY_INLINE VF softplus(DF d, VF z) {
  return hn::IfThenElse(hn::Gt(z, hn::Set(d, 20.f)), z, hn::Log1p(d, exp(d, z)));
}

// silu(z) = z sigmoid(z).
HWY_INLINE VF silu(DF d, VF z) { return hn::Mul(z, logistic(d, z)); }

// silu'(z) = s (1 + z (1 - s)) with s = sigmoid(z).
HWY_INLINE VF silu_grad(DF d, VF z, VF s) {
  const VF one = hn::Set(d, 1.f);
  return hn::Mul(s, hn::MulAdd(z, hn::Sub(one, s), one));
}

}  // namespace

void mamba2_dt_forward_impl(const float* raw, i64 raw_stride, const float* dt_bias, const float* A, const float* x,
                            i64 x_stride, float* dt, float* g, float* v, i64 N, i64 H, i64 P) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* rr = raw + n * raw_stride;
      float* dtr = dt + n * H;
      float* gr = g + n * H;
      for_each_vector(d, H, [&](i64 h, size_t c) {
        const VF s = softplus(d, hn::Add(load_part(d, rr + h, c), load_part(d, dt_bias + h, c)));
        store_part(d, s, dtr + h, c);
        store_part(d, hn::Mul(load_part(d, A + h, c), s), gr + h, c);
      });
      for (i64 h = 0; h < H; ++h) scale_row(d, dtr[h], x + n * x_stride + h * P, v + (n * H + h) * P, P);
    }
  }, 16);
}

void mamba2_dt_scale_x_impl(const float* dt, const float* x, i64 x_stride, float* v, i64 N, i64 H, i64 P) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n)
      for (i64 h = 0; h < H; ++h) scale_row(d, dt[n * H + h], x + n * x_stride + h * P, v + (n * H + h) * P, P);
  }, 16);
}

void mamba2_skip_gate_forward_impl(float* y, const float* x, i64 x_stride, const float* D, const float* z,
                                   i64 z_stride, float* out, i64 N, i64 H, i64 P) {
  const i64 F = H * P;
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n)
      for (i64 h = 0; h < H; ++h) {
        const VF Dh = hn::Set(d, D[h]);
        float* yr = y + n * F + h * P;
        const float* xr = x + n * x_stride + h * P;
        const float* zr = z + n * z_stride + h * P;
        float* outr = out + n * F + h * P;
        for_each_vector(d, P, [&](i64 p, size_t c) {
          const VF yv = hn::MulAdd(Dh, load_part(d, xr + p, c), load_part(d, yr + p, c));
          store_part(d, yv, yr + p, c);
          store_part(d, hn::Mul(yv, silu(d, load_part(d, zr + p, c))), outr + p, c);
        });
      }
  }, 16);
}

void silu_gate_norm_recompute_impl(const float* y, const float* z, i64 z_stride, const float* rstd, const float* w,
                                   float* yg, float* yn, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const VF r = hn::Set(d, rstd[n]);
      const float* yr = y + n * F;
      const float* zr = z + n * z_stride;
      float* gr = yg + n * F;
      float* nr = yn + n * F;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        const VF gv = hn::Mul(load_part(d, yr + i, c), silu(d, load_part(d, zr + i, c)));
        store_part(d, gv, gr + i, c);
        store_part(d, hn::Mul(hn::Mul(gv, r), load_part(d, w + i, c)), nr + i, c);
      });
    }
  }, 16);
}

void silu_gate_backward_impl(const float* y, const float* z, i64 z_stride, const float* dout, float* dy, float* dz,
                             i64 dz_stride, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* yr = y + n * F;
      const float* zr = z + n * z_stride;
      const float* dor = dout + n * F;
      float* dyr = dy + n * F;
      float* dzr = dz + n * dz_stride;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        const VF zv = load_part(d, zr + i, c), gv = load_part(d, dor + i, c);
        const VF s = logistic(d, zv);
        store_part(d, hn::Mul(gv, hn::Mul(zv, s)), dyr + i, c);
        store_part(d, hn::Mul(hn::Mul(gv, load_part(d, yr + i, c)), silu_grad(d, zv, s)), dzr + i, c);
      });
    }
  }, 16);
}

void mamba2_dt_backward_impl(const float* x, i64 x_stride, const float* dv, const float* dys, const float* dt,
                             const float* D, const float* A, const float* dg, float* dx, i64 dx_stride, float* draw,
                             i64 draw_stride, float* part, i64 N, i64 H, i64 P) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    std::vector<float> sums(static_cast<size_t>(2 * H));  // per head: sum dv x, sum dys x
    for (i64 n = b; n < e; ++n) {
      const float* dtr = dt + n * H;
      for (i64 h = 0; h < H; ++h) {
        const float* xr = x + n * x_stride + h * P;
        const float* dvr = dv + (n * H + h) * P;
        const float* dyr = dys + (n * H + h) * P;
        float* dxr = dx + n * dx_stride + h * P;
        const VF Dh = hn::Set(d, D[h]), dth = hn::Set(d, dtr[h]);
        VF sdv = hn::Zero(d), sdy = hn::Zero(d);
        for_each_vector(d, P, [&](i64 p, size_t c) {
          const VF xv = load_part(d, xr + p, c), dvv = load_part(d, dvr + p, c), dyv = load_part(d, dyr + p, c);
          sdv = hn::MulAdd(dvv, xv, sdv);
          sdy = hn::MulAdd(dyv, xv, sdy);
          store_part(d, hn::MulAdd(Dh, dyv, hn::Mul(dth, dvv)), dxr + p, c);
        });
        sums[h] = sum_lanes(d, sdv);
        sums[H + h] = sum_lanes(d, sdy);
      }
      float* drr = draw + n * draw_stride;
      float* pD = part + n * H;
      float* pA = part + (N + n) * H;
      float* pB = part + (2 * N + n) * H;
      for_each_vector(d, H, [&](i64 h, size_t c) {
        const VF dgv = load_part(d, dg + n * H + h, c), dtv = load_part(d, dtr + h, c);
        const VF ddt = hn::MulAdd(dgv, load_part(d, A + h, c), load_part(d, sums.data() + h, c));
        // softplus'(raw + dt_bias) = sigmoid(.) = 1 - e^-dt; expm1 keeps it exact for small dt.
        const VF dr = hn::Mul(ddt, hn::Neg(hn::Expm1(d, hn::Neg(dtv))));
        store_part(d, dr, drr + h, c);
        store_part(d, load_part(d, sums.data() + H + h, c), pD + h, c);
        store_part(d, hn::Mul(dgv, dtv), pA + h, c);
        store_part(d, dr, pB + h, c);
      });
    }
  }, 16);
}

void norm_silu_gate_forward_impl(const float* o, const float* gp, i64 gp_stride, const float* w, float* rstd,
                                 bool write_rstd, float* z, i64 N, i64 H, i64 K, float eps) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n)
      for (i64 h = 0; h < H; ++h) {
        const float* orow = o + (n * H + h) * K;
        const float* grow = gp + n * gp_stride + h * K;
        float* zrow = z + (n * H + h) * K;
        float r;
        if (write_rstd) {
          VF ss = hn::Zero(d);
          for_each_vector(d, K, [&](i64 i, size_t c) {
            const VF v = load_part(d, orow + i, c);
            ss = hn::MulAdd(v, v, ss);
          });
          r = 1.f / std::sqrt(sum_lanes(d, ss) / static_cast<float>(K) + eps);
          rstd[n * H + h] = r;
        } else {
          r = rstd[n * H + h];
        }
        const VF rv = hn::Set(d, r);
        for_each_vector(d, K, [&](i64 i, size_t c) {
          const VF on = hn::Mul(hn::Mul(load_part(d, orow + i, c), rv), load_part(d, w + i, c));
          store_part(d, hn::Mul(on, silu(d, load_part(d, grow + i, c))), zrow + i, c);
        });
      }
  }, 16);
}

// With xh = o r, on = xh w, sg = silu(gp):  d_on = dz sg;  d_gp = dz on silu'(gp);  dw += d_on xh;
// d_o = r (d_on w - xh mean(d_on w xh)).
void norm_silu_gate_backward_impl(const float* o, const float* gp, i64 gp_stride, const float* w, const float* rstd,
                                  const float* dz, float* d_o, float* d_gp, float* dw, i64 N, i64 H, i64 K) {
  const i64 nchunks = std::max<i64>(1, std::min<i64>(num_threads(), N));
  std::vector<float> part(static_cast<size_t>(nchunks * K), 0.f);  // [nchunks, K]
  parallel_for_each(nchunks, [&](i64 ch) {
    const DF d;
    const i64 lo = N * ch / nchunks, hi = N * (ch + 1) / nchunks;
    float* pw = part.data() + ch * K;
    for (i64 n = lo; n < hi; ++n)
      for (i64 h = 0; h < H; ++h) {
        const float* orow = o + (n * H + h) * K;
        const float* grow = gp + n * gp_stride + h * K;
        const float* dzr = dz + (n * H + h) * K;
        float* dor = d_o + (n * H + h) * K;
        float* dgr = d_gp + n * gp_stride + h * K;
        const VF rv = hn::Set(d, rstd[n * H + h]);
        VF dot = hn::Zero(d);
        for_each_vector(d, K, [&](i64 i, size_t c) {
          const VF gv = load_part(d, grow + i, c), dzv = load_part(d, dzr + i, c), wv = load_part(d, w + i, c);
          const VF s = logistic(d, gv);
          const VF xh = hn::Mul(load_part(d, orow + i, c), rv);
          const VF don = hn::Mul(dzv, hn::Mul(gv, s));
          const VF dsilu = silu_grad(d, gv, s);
          store_part(d, hn::Mul(hn::Mul(dzv, hn::Mul(xh, wv)), dsilu), dgr + i, c);
          store_part(d, hn::MulAdd(don, xh, load_part(d, pw + i, c)), pw + i, c);
          const VF donw = hn::Mul(don, wv);
          store_part(d, donw, dor + i, c);  // finished below
          dot = hn::MulAdd(donw, xh, dot);
        });
        const VF c2 = hn::Mul(rv, hn::Set(d, sum_lanes(d, dot) / static_cast<float>(K)));
        for_each_vector(d, K, [&](i64 i, size_t c) {
          // r (d_on w - o r c2)
          const VF v = hn::NegMulAdd(hn::Mul(load_part(d, orow + i, c), rv), c2,
                                     hn::Mul(rv, load_part(d, dor + i, c)));
          store_part(d, v, dor + i, c);
        });
      }
  });
  add_rows_in_order(DF(), part.data(), nchunks, K, dw);
}

// ---- Lightning --------------------------------------------------------------------------------------------------

void lightning_activate_impl(const float* pre, float* qkv, i64 qkv_stride, float* gate, i64 gate_stride, i64 N,
                             i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* pr = pre + n * 4 * F;
      float* ar = qkv + n * qkv_stride;
      float* gr = gate + n * gate_stride;
      for_each_vector(d, 3 * F, [&](i64 i, size_t c) { store_part(d, silu(d, load_part(d, pr + i, c)), ar + i, c); });
      for_each_vector(d, F, [&](i64 i, size_t c) {
        store_part(d, logistic(d, load_part(d, pr + 3 * F + i, c)), gr + i, c);
      });
    }
  }, 16);
}

void gate_multiply_impl(float* u, const float* g, i64 g_stride, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      float* ur = u + n * F;
      const float* gr = g + n * g_stride;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        store_part(d, hn::Mul(load_part(d, ur + i, c), load_part(d, gr + i, c)), ur + i, c);
      });
    }
  }, 16);
}

void norm_gate_recompute_impl(const float* o, const float* rstd, const float* w, const float* g, i64 g_stride,
                              float* nrm, float* u, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const VF r = hn::Set(d, rstd[n]);
      const float* orow = o + n * F;
      const float* gr = g + n * g_stride;
      float* nr = nrm + n * F;
      float* ur = u + n * F;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        const VF nv = hn::Mul(hn::Mul(load_part(d, orow + i, c), r), load_part(d, w + i, c));
        store_part(d, nv, nr + i, c);
        store_part(d, hn::Mul(nv, load_part(d, gr + i, c)), ur + i, c);
      });
    }
  }, 16);
}

void sigmoid_gate_backward_impl(const float* nrm, const float* g, i64 g_stride, float* du, float* dgate_pre,
                                i64 dg_stride, i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    const VF one = hn::Set(d, 1.f);
    for (i64 n = b; n < e; ++n) {
      const float* nr = nrm + n * F;
      const float* gr = g + n * g_stride;
      float* dur = du + n * F;
      float* dgr = dgate_pre + n * dg_stride;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        const VF gv = load_part(d, gr + i, c), dv = load_part(d, dur + i, c);
        const VF dgate = hn::Mul(hn::Mul(hn::Mul(dv, load_part(d, nr + i, c)), gv), hn::Sub(one, gv));
        store_part(d, dgate, dgr + i, c);
        store_part(d, hn::Mul(dv, gv), dur + i, c);
      });
    }
  }, 16);
}

void silu_backward_impl(const float* pre, i64 pre_stride, const float* dd, i64 d_stride, float* out, i64 out_stride,
                        i64 N, i64 F) {
  parallel_for(N, [&](i64 b, i64 e) {
    const DF d;
    for (i64 n = b; n < e; ++n) {
      const float* pr = pre + n * pre_stride;
      const float* dr = dd + n * d_stride;
      float* orow = out + n * out_stride;
      for_each_vector(d, F, [&](i64 i, size_t c) {
        const VF x = load_part(d, pr + i, c);
        store_part(d, hn::Mul(load_part(d, dr + i, c), silu_grad(d, x, logistic(d, x))), orow + i, c);
      });
    }
  }, 16);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(mamba2_dt_forward_impl);
HWY_EXPORT(mamba2_dt_scale_x_impl);
HWY_EXPORT(mamba2_skip_gate_forward_impl);
HWY_EXPORT(silu_gate_norm_recompute_impl);
HWY_EXPORT(silu_gate_backward_impl);
HWY_EXPORT(mamba2_dt_backward_impl);
HWY_EXPORT(norm_silu_gate_forward_impl);
HWY_EXPORT(norm_silu_gate_backward_impl);
HWY_EXPORT(lightning_activate_impl);
HWY_EXPORT(gate_multiply_impl);
HWY_EXPORT(norm_gate_recompute_impl);
HWY_EXPORT(sigmoid_gate_backward_impl);
HWY_EXPORT(silu_backward_impl);

void mamba2_dt_forward(const float* raw, i64 raw_stride, const float* dt_bias, const float* A, const float* x,
                       i64 x_stride, float* dt, float* g, float* v, i64 N, i64 H, i64 P) {
  HLM_CHECK(N >= 0 && H > 0 && P > 0 && raw_stride >= H && x_stride >= H * P,
            "mamba2_dt_forward: bad shape N={} H={} P={} raw_stride={} x_stride={}", N, H, P, raw_stride, x_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(mamba2_dt_forward_impl)(raw, raw_stride, dt_bias, A, x, x_stride, dt, g, v, N, H, P);
}

void mamba2_dt_scale_x(const float* dt, const float* x, i64 x_stride, float* v, i64 N, i64 H, i64 P) {
  HLM_CHECK(N >= 0 && H > 0 && P > 0 && x_stride >= H * P, "mamba2_dt_scale_x: bad shape N={} H={} P={} x_stride={}",
            N, H, P, x_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(mamba2_dt_scale_x_impl)(dt, x, x_stride, v, N, H, P);
}

void mamba2_skip_gate_forward(float* y, const float* x, i64 x_stride, const float* D, const float* z, i64 z_stride,
                              float* out, i64 N, i64 H, i64 P) {
  HLM_CHECK(N >= 0 && H > 0 && P > 0 && x_stride >= H * P && z_stride >= H * P,
            "mamba2_skip_gate_forward: bad shape N={} H={} P={} x_stride={} z_stride={}", N, H, P, x_stride,
            z_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(mamba2_skip_gate_forward_impl)(y, x, x_stride, D, z, z_stride, out, N, H, P);
}

void silu_gate_norm_recompute(const float* y, const float* z, i64 z_stride, const float* rstd, const float* w,
                              float* yg, float* yn, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && z_stride >= F, "silu_gate_norm_recompute: bad shape N={} F={} z_stride={}", N, F,
            z_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(silu_gate_norm_recompute_impl)(y, z, z_stride, rstd, w, yg, yn, N, F);
}

void silu_gate_backward(const float* y, const float* z, i64 z_stride, const float* dout, float* dy, float* dz,
                        i64 dz_stride, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && z_stride >= F && dz_stride >= F,
            "silu_gate_backward: bad shape N={} F={} z_stride={} dz_stride={}", N, F, z_stride, dz_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(silu_gate_backward_impl)(y, z, z_stride, dout, dy, dz, dz_stride, N, F);
}

void mamba2_dt_backward(const float* x, i64 x_stride, const float* dv, const float* dys, const float* dt,
                        const float* D, const float* A, const float* dg, float* dx, i64 dx_stride, float* draw,
                        i64 draw_stride, float* part, i64 N, i64 H, i64 P) {
  HLM_CHECK(N >= 0 && H > 0 && P > 0 && x_stride >= H * P && dx_stride >= H * P && draw_stride >= H,
            "mamba2_dt_backward: bad shape N={} H={} P={} x_stride={} dx_stride={} draw_stride={}", N, H, P, x_stride,
            dx_stride, draw_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(mamba2_dt_backward_impl)(x, x_stride, dv, dys, dt, D, A, dg, dx, dx_stride, draw, draw_stride,
                                                part, N, H, P);
}

void norm_silu_gate_forward(const float* o, const float* gp, i64 gp_stride, const float* w, float* rstd,
                            bool write_rstd, float* z, i64 N, i64 H, i64 K, float eps) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && gp_stride >= H * K && eps >= 0.f,
            "norm_silu_gate_forward: bad shape N={} H={} K={} gp_stride={} eps={}", N, H, K, gp_stride, eps);
  init_simd();
  HWY_DYNAMIC_DISPATCH(norm_silu_gate_forward_impl)(o, gp, gp_stride, w, rstd, write_rstd, z, N, H, K, eps);
}

void norm_silu_gate_backward(const float* o, const float* gp, i64 gp_stride, const float* w, const float* rstd,
                             const float* dz, float* d_o, float* d_gp, float* dw, i64 N, i64 H, i64 K) {
  HLM_CHECK(N >= 0 && H > 0 && K > 0 && gp_stride >= H * K,
            "norm_silu_gate_backward: bad shape N={} H={} K={} gp_stride={}", N, H, K, gp_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(norm_silu_gate_backward_impl)(o, gp, gp_stride, w, rstd, dz, d_o, d_gp, dw, N, H, K);
}

void lightning_activate(const float* pre, float* qkv, i64 qkv_stride, float* gate, i64 gate_stride, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && qkv_stride >= 3 * F && gate_stride >= F,
            "lightning_activate: bad shape N={} F={} qkv_stride={} gate_stride={}", N, F, qkv_stride, gate_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(lightning_activate_impl)(pre, qkv, qkv_stride, gate, gate_stride, N, F);
}

void gate_multiply(float* u, const float* g, i64 g_stride, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && g_stride >= F, "gate_multiply: bad shape N={} F={} g_stride={}", N, F, g_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(gate_multiply_impl)(u, g, g_stride, N, F);
}

void norm_gate_recompute(const float* o, const float* rstd, const float* w, const float* g, i64 g_stride, float* nrm,
                         float* u, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && g_stride >= F, "norm_gate_recompute: bad shape N={} F={} g_stride={}", N, F,
            g_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(norm_gate_recompute_impl)(o, rstd, w, g, g_stride, nrm, u, N, F);
}

void sigmoid_gate_backward(const float* nrm, const float* g, i64 g_stride, float* du, float* dgate_pre,
                           i64 dg_stride, i64 N, i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && g_stride >= F && dg_stride >= F,
            "sigmoid_gate_backward: bad shape N={} F={} g_stride={} dg_stride={}", N, F, g_stride, dg_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(sigmoid_gate_backward_impl)(nrm, g, g_stride, du, dgate_pre, dg_stride, N, F);
}

void silu_backward(const float* pre, i64 pre_stride, const float* d, i64 d_stride, float* out, i64 out_stride, i64 N,
                   i64 F) {
  HLM_CHECK(N >= 0 && F > 0 && pre_stride >= F && d_stride >= F && out_stride >= F,
            "silu_backward: bad shape N={} F={} strides pre {} d {} out {}", N, F, pre_stride, d_stride, out_stride);
  init_simd();
  HWY_DYNAMIC_DISPATCH(silu_backward_impl)(pre, pre_stride, d, d_stride, out, out_stride, N, F);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
